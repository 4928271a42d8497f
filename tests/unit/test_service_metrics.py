"""The service's metrics (spec/SERVICE.md SVC-53), read back from the rendered text with
prometheus_client's own parser, so each assertion is on what a Prometheus server would scrape."""

from __future__ import annotations

import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tidelog.errors import BadOption
from tidelog.records import TopicState
from tidelog.service.metrics import CONTENT_TYPE, OTHER, Metrics

Key = tuple[str, frozenset[tuple[str, str]]]


def scrape(metrics: Metrics) -> dict[Key, float]:
    """Every sample of one scrape: (sample name, labels) -> value."""
    body, content_type = metrics.render()
    assert content_type == CONTENT_TYPE
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(body.decode("utf-8"))
        for s in family.samples
    }


def value(samples: dict[Key, float], name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def by_topic(samples: dict[Key, float], name: str) -> dict[str, float]:
    return {dict(labels)["topic"]: v for (n, labels), v in samples.items() if n == name}


def state(head_seq: int, count: int, size: int) -> TopicState:
    return TopicState(
        head_seq=head_seq, earliest_seq=head_seq - count + 1, evict_floor=0, count=count, bytes=size
    )


def test_SVC_53_requests_by_route_method_and_status() -> None:
    """SVC-53: `tidelog_http_requests_total{route,method,status}` counts answers and
    `tidelog_http_request_seconds{route}` is their histogram, labelled by route template."""
    m = Metrics()
    m.request("/v0/topics/{t}/records", "POST", 200, 0.003)
    m.request("/v0/topics/{t}/records", "POST", 200, 0.004)
    m.request("/v0/topics/{t}/records", "GET", 404, 0.2)
    s = scrape(m)
    route = "/v0/topics/{t}/records"
    total = "tidelog_http_requests_total"
    assert value(s, total, route=route, method="POST", status="200") == 2
    assert value(s, total, route=route, method="GET", status="404") == 1
    hist = "tidelog_http_request_seconds"
    assert value(s, f"{hist}_bucket", route=route, le="0.0025") == 0
    assert value(s, f"{hist}_bucket", route=route, le="0.005") == 2
    assert value(s, f"{hist}_bucket", route=route, le="0.25") == 3
    assert value(s, f"{hist}_count", route=route) == 3
    assert value(s, f"{hist}_sum", route=route) == pytest.approx(0.207)


def test_SVC_53_appends_streams_and_the_scheduler() -> None:
    """SVC-53: appends, open streams, stream events, throttled appends, pressure, ready and
    deferred topics and the delivery delay histogram hold exactly what the app reported."""
    m = Metrics()
    m.appended("a", 3)
    m.appended("a", 1)
    m.appended("b", 5)
    for _ in range(3):
        m.stream_opened("a")
    m.stream_closed("a")
    m.stream_events("a", 7)
    m.throttled()
    m.throttled()
    m.set_pressure(0.85)
    m.set_ready(12)
    m.set_deferred(2)
    m.delivery_delay(0.0007)
    m.delivery_delay(0.03)
    s = scrape(m)
    assert by_topic(s, "tidelog_appends_total") == {"a": 4, "b": 5}
    assert by_topic(s, "tidelog_streams") == {"a": 2}
    assert by_topic(s, "tidelog_stream_events_total") == {"a": 7}
    assert value(s, "tidelog_throttled_total") == 2
    assert value(s, "tidelog_pressure") == 0.85
    assert value(s, "tidelog_ready_topics") == 12
    assert value(s, "tidelog_deferred_topics") == 2
    delay = "tidelog_delivery_delay_seconds"
    assert value(s, f"{delay}_bucket", le="0.0005") == 0
    assert value(s, f"{delay}_bucket", le="0.001") == 1
    assert value(s, f"{delay}_bucket", le="0.05") == 2
    assert value(s, f"{delay}_count") == 2


def test_SVC_53_topic_gauges_are_read_at_scrape_time() -> None:
    """SVC-53: `tidelog_topic_head_seq`, `_count` and `_bytes` per topic come from the app's
    callable at each scrape, so they follow the store without the app reporting them."""
    states = {"a": state(10, 4, 400), "b": state(3, 3, 30)}
    m = Metrics(topics=lambda: states)
    s = scrape(m)
    assert by_topic(s, "tidelog_topic_head_seq") == {"a": 10, "b": 3}
    assert by_topic(s, "tidelog_topic_count") == {"a": 4, "b": 3}
    assert by_topic(s, "tidelog_topic_bytes") == {"a": 400, "b": 30}
    states["a"] = state(11, 5, 500)
    del states["b"]
    assert by_topic(scrape(m), "tidelog_topic_head_seq") == {"a": 11}


def test_SVC_53_topic_labels_are_capped_and_the_rest_summed_under_other() -> None:
    """SVC-53: only `--metrics-max-topics` topics get their own label: the first named (by the
    app's calls, then at a scrape in name order), each for the life of the process; every other
    topic is summed under `topic="_other"`, in counters and gauges alike."""
    calls = 0
    states = {t: state(n, n, 10 * n) for n, t in enumerate(["d", "c", "b", "a", "x"], start=1)}

    def topics() -> dict[str, TopicState]:
        nonlocal calls
        calls += 1
        return states

    m = Metrics(max_topics=2)
    m.set_topic_states(topics)
    assert calls == 0  # registering reads nothing
    m.appended("x", 1)  # x is named first: a label of its own
    s = scrape(m)
    assert calls == 1
    # then a (first in name order) takes the second label; b, c, d share _other
    assert by_topic(s, "tidelog_topic_count") == {"a": 4, "x": 5, OTHER: 3 + 2 + 1}
    assert by_topic(s, "tidelog_topic_bytes") == {"a": 40, "x": 50, OTHER: 60}
    assert by_topic(s, "tidelog_topic_head_seq") == {"a": 4, "x": 5, OTHER: 6}
    m.appended("b", 2)
    m.appended("new", 3)
    m.appended("x", 1)
    m.stream_opened("c")
    m.stream_opened("a")
    s = scrape(m)
    assert by_topic(s, "tidelog_appends_total") == {"x": 2, OTHER: 5}
    assert by_topic(s, "tidelog_streams") == {"a": 1, OTHER: 1}
    m.stream_closed("c")
    assert by_topic(scrape(m), "tidelog_streams") == {"a": 1, OTHER: 0}

    none = Metrics(max_topics=0, topics=topics)
    assert calls == 3  # registering with the callable given reads nothing either
    none.appended("a", 1)
    s = scrape(none)
    assert by_topic(s, "tidelog_appends_total") == {OTHER: 1}
    assert by_topic(s, "tidelog_topic_count") == {OTHER: 15}
    with pytest.raises(BadOption, match="metrics_max_topics=-1"):
        Metrics(max_topics=-1)


def test_SVC_53_each_service_has_its_own_registry() -> None:
    """SVC-53: two services in one process count apart, and nothing lands in
    prometheus_client's global registry."""
    one, two = Metrics(), Metrics()
    one.throttled()
    assert value(scrape(one), "tidelog_throttled_total") == 1
    assert value(scrape(two), "tidelog_throttled_total") == 0
    global_text = prometheus_client.generate_latest(prometheus_client.REGISTRY).decode()
    assert "tidelog_" not in global_text
