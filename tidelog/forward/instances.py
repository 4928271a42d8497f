"""Forwarding a topic of an instances store (FWD-33, spec/INSTANCES.md INST-12).

The topic is the union of its instances' logs (INST-7). Each instance's stream is drained by a
topic source of its own (FWD-22: ``fsn = seq - 1`` of that instance) under a client id of its
own, ``<client id>.<instance>``: the receiver de-duplicates each by its FSNs (FWD-19), so every
record reaches it once whatever crashes. One FSN numbering across instances cannot be
reproduced after a crash (which record of which instance came first depends on when each
became visible, INST-8), and a replay numbered differently would be taken for frames already
stored. Progress is one merged subscriber (INST-15..INST-17): acknowledging FSN ``f`` of
instance ``i`` commits position ``f + 1`` of instance ``i`` alone.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, cast

from tidelog.api import Topic
from tidelog.backends.instances.merged import Merged, MergedSubscriber, merged
from tidelog.errors import NotAvailable
from tidelog.model.instances import cursor_text
from tidelog.records import Item

from .conf import SenderConfig, parse_conf
from .errors import SenderError
from .source import TopicSource, suffixed_client_id

if TYPE_CHECKING:
    from .forwarder import Forwarder

__all__ = ["InstancesForwarder", "instance_client_id"]


def instance_client_id(client_id: str, instance: int) -> str:
    """The client id instance ``instance``'s frames are sent under (FWD-33)."""
    return suffixed_client_id(client_id, f".{instance}", "FWD-33")


class _Head:
    __slots__ = ("head_seq",)

    def __init__(self, head_seq: int) -> None:
        self.head_seq = head_seq


class _InstanceProgress:
    """The merged subscriber's position in one instance, as TopicSource uses a Subscriber."""

    def __init__(self, sub: MergedSubscriber, instance: int, count: int) -> None:
        self._sub, self._instance, self._count = sub, instance, count

    @property
    def hwm(self) -> int:
        return int(self._sub.hwm.split(".")[self._instance])

    def commit(self, seq: int) -> None:
        positions = [0] * self._count
        positions[self._instance] = seq
        self._sub.commit(cursor_text(positions))  # durable when it returns (INST-17)

    def flush(self) -> None:
        pass  # every commit above is durable already


class InstanceTopic:
    """Instance ``instance``'s copy of a topic of an instances store, as TopicSource reads a
    Topic: its own stream of the merged read (INST-7), its head, and the merged subscriber's
    position there."""

    def __init__(
        self, view: Merged, sub: MergedSubscriber, instance: int, name: str, incarnation: int
    ) -> None:
        self._view, self._instance = view, instance
        self.name = f"{name}@{instance}"
        # the shared incarnation (INST-6): every copy of it is made for it, seqs from 1 (FWD-34)
        self.incarnation = incarnation
        self._progress = _InstanceProgress(sub, instance, view.instances)

    def subscribe(self, name: str, start: str = "earliest") -> _InstanceProgress:
        return self._progress  # registered in every instance by the merged subscribe

    def state(self) -> _Head:
        return _Head(self._view.head_seq(self._instance))

    def read(self, after: int = 0, limit: int = 1000, wait_ms: int = 0) -> list[Item]:
        deadline = time.monotonic() + wait_ms / 1000.0
        delay = 0.005
        while True:
            items: list[Item] = self._view.read_instance(self._instance, after, limit)
            left = deadline - time.monotonic()
            if items or left <= 0:
                return items
            # other instances change in other processes: poll, backing off to 50 ms
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.05)
            self._view.head_seq(self._instance)  # refreshes the views


class _Name:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


class InstancesForwarder:
    """One forwarder per instance of the topic's store, held and closed together (FWD-33).
    ``acked_fsn`` and ``published_fsn`` add the instances' up (each FSN count less one), so
    ``published_fsn - acked_fsn`` is what is not acknowledged yet in any instance. Made by
    ``Forwarder.for_topic``, which hands in its class (this module does not import it: the
    import would close a cycle)."""

    def __init__(
        self,
        forwarder: type[Forwarder],
        conf: str | SenderConfig,
        topic: Topic,
        *,
        subscriber: str = "forward",
        start: str = "earliest",
        **kwargs: Any,
    ) -> None:
        self.conf = parse_conf(conf) if isinstance(conf, str) else conf
        view = merged(topic)
        ids = [instance_client_id(self.conf.client_id, i) for i in range(view.instances)]
        sub = view.subscribe(subscriber, start=start)
        self.source = _Name(f"topic {topic.name!r} (merged subscriber {subscriber!r})")
        self.forwarders: list[Forwarder] = []
        try:
            for i, client_id in enumerate(ids):
                conf_i = self.conf.with_changes(
                    tidelog_client_id=client_id, drain_orphans=self.conf.drain_orphans and i == 0
                )
                # InstanceTopic has the part of Topic a TopicSource uses (subscribe, state,
                # read, incarnation)
                one = cast(Topic, InstanceTopic(view, sub, i, topic.name, topic.incarnation))
                source = TopicSource(one, subscriber)
                try:
                    self.forwarders.append(forwarder(conf_i, source=source, **kwargs))
                except BaseException:
                    source.close()
                    raise
        except BaseException:
            self._close_all()
            raise

    # -- producer API: the topic is written through the store ------------------------------
    def append(self, payload: bytes) -> int:
        raise NotAvailable(f"{self.source.name}: append to the topic itself, not the forwarder")

    def flush(self) -> None:
        self.check_error()

    def check_error(self) -> None:
        for fwd in self.forwarders:
            fwd.check_error()

    def wait_acked(self, fsn: int | None = None, timeout: float = 30.0) -> bool:
        """Block until every instance's published frames are acknowledged (``fsn`` is not
        one number here: only None), a terminal error, or ``timeout`` seconds."""
        if fsn is not None:
            raise NotAvailable("wait_acked(fsn): FSNs are per instance here (FWD-33)")
        end = time.monotonic() + timeout
        done = True
        for fwd in self.forwarders:
            done = fwd.wait_acked(timeout=max(0.0, end - time.monotonic())) and done
        return done

    # -- state -----------------------------------------------------------------------------
    @property
    def acked_fsn(self) -> int:
        return sum(f.acked_fsn + 1 for f in self.forwarders) - 1

    @property
    def published_fsn(self) -> int:
        return sum(f.published_fsn + 1 for f in self.forwarders) - 1

    @property
    def acked(self) -> str:
        """Each instance's acknowledged seq as an INST-8 cursor text."""
        return str(cursor_text([f.acked_fsn + 1 for f in self.forwarders]))

    @property
    def connected(self) -> bool:
        return all(f.connected for f in self.forwarders)

    @property
    def running(self) -> bool:
        return all(f.running for f in self.forwarders)

    @property
    def last_terminal_error(self) -> SenderError | None:
        return next((e for f in self.forwarders if (e := f.last_terminal_error)), None)

    def counters(self) -> dict[str, Any]:
        """The instances' counters added up (numbers), the first terminal error, and each
        instance's own under ``instances``."""
        each = [f.counters() for f in self.forwarders]
        out: dict[str, Any] = {}
        for c in each:
            for key, value in c.items():
                if isinstance(value, int) and not isinstance(value, bool):
                    out[key] = out.get(key, 0) + value
        out["acked_fsn"], out["published_fsn"] = self.acked_fsn, self.published_fsn
        out["last_terminal_error"] = self.last_terminal_error
        out["instances"] = [
            {k: (str(v) if isinstance(v, SenderError) else v) for k, v in c.items()} for c in each
        ]
        return out

    # -- close (FWD-15, per instance) ------------------------------------------------------
    def close(self) -> None:
        """Close every instance's forwarder (FWD-15 each); then raise the first error."""
        first = self._close_all()
        if first is not None:
            raise first

    def _close_all(self) -> BaseException | None:
        first: BaseException | None = None
        for fwd in self.forwarders:
            try:
                fwd.close()
            except BaseException as exc:
                first = first or exc
        return first

    def __enter__(self) -> InstancesForwarder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<tidelog.forward.InstancesForwarder {self.conf.client_id} acked={self.acked}>"
