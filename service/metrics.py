"""``GET /v0/metrics``: the service's metrics in the Prometheus text format (spec/SERVICE.md
SVC-53).

Each ``Metrics`` has its own ``CollectorRegistry`` (never prometheus_client's global one), so
tests and several services in one process never share a series. The app calls one method per
event; the per-topic gauges are read at scrape time from a callable the app gives.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from tidelog.errors import BadOption
from tidelog.records import TopicState

__all__ = ["Metrics", "OTHER", "CONTENT_TYPE", "TopicStates"]

#: SVC-53: the label value of every topic past ``--metrics-max-topics``.
OTHER: Final = "_other"
#: What ``generate_latest`` writes: the classic text format, which every Prometheus reads.
CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"

#: The app's view of the store at a scrape: each topic's state.
TopicStates = Callable[[], Mapping[str, TopicState]]

_REQUEST_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
)
_CHILDREN_MAX = 4096  # cached label sets of the per-request series (Metrics)
_DELAY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class _TopicLabels:
    """SVC-53: the first ``cap`` topics named get their own label value, for the life of the
    process, so a counter never moves from one series to another; every other topic is
    ``_other``."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._own: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, topic: str) -> str:
        with self._lock:
            if topic in self._own:
                return topic
            if len(self._own) < self.cap:
                self._own.add(topic)
                return topic
            return OTHER


class _TopicGauges(Collector):
    """``tidelog_topic_head_seq``, ``_count`` and ``_bytes`` per topic label, read at scrape
    time; topics sharing ``_other`` are summed."""

    _FIELDS = (
        ("head_seq", "The topic's head_seq (the last seq assigned)."),
        ("count", "Records the topic holds."),
        ("bytes", "Payload bytes the topic holds."),
    )

    def __init__(self, labels: _TopicLabels) -> None:
        self.labels = labels
        self.states: TopicStates | None = None

    def describe(self) -> Iterator[GaugeMetricFamily]:
        # The names alone, so registering reads no state (the store may not be open yet).
        for field, doc in self._FIELDS:
            yield GaugeMetricFamily(f"tidelog_topic_{field}", doc, labels=["topic"])

    def collect(self) -> Iterator[GaugeMetricFamily]:
        states = self.states() if self.states is not None else {}
        sums: dict[str, list[int]] = {}
        for topic in sorted(states):  # new topics take free labels in name order
            state = states[topic]
            row = sums.setdefault(self.labels(topic), [0, 0, 0])
            for i, (field, _) in enumerate(self._FIELDS):
                row[i] += getattr(state, field)
        for i, (field, doc) in enumerate(self._FIELDS):
            family = GaugeMetricFamily(f"tidelog_topic_{field}", doc, labels=["topic"])
            for label in sorted(sums):
                family.add_metric([label], sums[label][i])
            yield family


class Metrics:
    """SVC-53: the service's metrics. ``max_topics`` is ``--metrics-max-topics``; ``topics``
    (or ``set_topic_states`` later) gives every topic's state at a scrape."""

    def __init__(self, *, max_topics: int = 1000, topics: TopicStates | None = None) -> None:
        if isinstance(max_topics, bool) or not isinstance(max_topics, int) or max_topics < 0:
            raise BadOption(
                f"option metrics_max_topics={max_topics!r}: expected 0 or more (SVC-53)"
            )
        self.registry = CollectorRegistry(auto_describe=True)
        self._label = _TopicLabels(max_topics)
        r = self.registry
        self._requests = Counter(
            "tidelog_http_requests",
            "HTTP requests answered, by route template, method and status.",
            ["route", "method", "status"],
            registry=r,
        )
        self._request_seconds = Histogram(
            "tidelog_http_request_seconds",
            "Time from a request's arrival to its answer, by route template.",
            ["route"],
            buckets=_REQUEST_BUCKETS,
            registry=r,
        )
        self._appends = Counter(
            "tidelog_appends", "Records appended through the API.", ["topic"], registry=r
        )
        self._streams = Gauge("tidelog_streams", "Open SSE streams.", ["topic"], registry=r)
        self._stream_events = Counter(
            "tidelog_stream_events", "Events written to SSE streams.", ["topic"], registry=r
        )
        self._pressure = Gauge("tidelog_pressure", "The governor's pressure, 0..1.", registry=r)
        self._ready = Gauge("tidelog_ready_topics", "Topics in the ready set.", registry=r)
        self._delay = Histogram(
            "tidelog_delivery_delay_seconds",
            "Time a ready topic waited for its delivery.",
            buckets=_DELAY_BUCKETS,
            registry=r,
        )
        self._deferred = Gauge(
            "tidelog_deferred_topics", "Topics whose push is deferred.", registry=r
        )
        self._throttled = Counter(
            "tidelog_throttled", "Appends refused with 429 throttled.", registry=r
        )
        self._topic_gauges = _TopicGauges(self._label)
        self._topic_gauges.states = topics
        r.register(self._topic_gauges)
        # the labelled children of the per-request series, looked up once per label set (a
        # topic's label never changes once given, _TopicLabels); bounded: methods and topics
        # are the clients' to choose
        self._request_children: dict[tuple[str, str, int], tuple[Any, Any]] = {}
        self._append_children: dict[str, Any] = {}

    def set_topic_states(self, topics: TopicStates) -> None:
        """The callable a scrape reads every topic's state from."""
        self._topic_gauges.states = topics

    def request(self, route: str, method: str, status: int, seconds: float) -> None:
        """One answered request; ``route`` is the route's template (``/v0/topics/{t}``), never
        the path, so the labels stay few."""
        key = (route, method, status)
        children = self._request_children.get(key)
        if children is None:
            children = (
                self._requests.labels(route, method, str(status)),
                self._request_seconds.labels(route),
            )
            if len(self._request_children) >= _CHILDREN_MAX:
                self._request_children.clear()
            self._request_children[key] = children
        children[0].inc()
        children[1].observe(seconds)

    def appended(self, topic: str, n: int) -> None:
        """``n`` records appended to ``topic`` (a batch counts its records)."""
        child = self._append_children.get(topic)
        if child is None:
            child = self._appends.labels(self._label(topic))
            if len(self._append_children) >= _CHILDREN_MAX:
                self._append_children.clear()
            self._append_children[topic] = child
        child.inc(n)

    def stream_opened(self, topic: str) -> None:
        self._streams.labels(self._label(topic)).inc()

    def stream_closed(self, topic: str) -> None:
        self._streams.labels(self._label(topic)).dec()

    def stream_events(self, topic: str, n: int) -> None:
        """``n`` events (records, tombstones) written to one of ``topic``'s streams."""
        self._stream_events.labels(self._label(topic)).inc(n)

    def throttled(self) -> None:
        self._throttled.inc()

    def set_pressure(self, p: float) -> None:
        self._pressure.set(p)

    def set_ready(self, n: int) -> None:
        self._ready.set(n)

    def set_deferred(self, n: int) -> None:
        self._deferred.set(n)

    def delivery_delay(self, seconds: float) -> None:
        """One delivery's wait: its start less the topic's ``enqueued_at``."""
        self._delay.observe(seconds)

    def render(self) -> tuple[bytes, str]:
        """The body and content type of ``GET /v0/metrics``."""
        return generate_latest(self.registry), CONTENT_TYPE
