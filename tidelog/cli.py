"""The ``tidelog`` command line: inspect, append, tail, verify, demo, version (spec/CLI.md).

Every command opens a store by URI through the public API only (``tidelog.open``), so the CLI sees
exactly what a library user sees. Exit status (CLI-1): 0 done and good; 1 done and bad (verify
found an error, a demo's check failed); 2 refused or failed: a ``TidelogError`` (or an OS error)
is one stderr line with its stable code (CLI-2, ERR-1), click's usage errors also exit 2; 130
interrupted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

import tidelog
from tidelog import _cli_format as fmt
from tidelog import cli_append, cli_instances
from tidelog.api import Store, Subscriber, Topic
from tidelog.cli_group import (
    EXIT_ERROR,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    fail,
    main,
    sigterm_as_interrupt,
)
from tidelog.cli_open import file_location, has_read_only_view, open_read_only
from tidelog.config import DURABILITY_CLASSES
from tidelog.errors import Backpressure, BadArgument
from tidelog.options import parse_size
from tidelog.records import Item, Record, Tombstone
from tidelog.uri import COLD_PREFIX

__all__ = ["main", "EXIT_OK", "EXIT_FAILED", "EXIT_ERROR", "EXIT_INTERRUPTED", "fail"]


# ---------------------------------------------------------------------------------------------
# inspect
# ---------------------------------------------------------------------------------------------
def _topic_report(topic: Topic, extras: Mapping[str, object]) -> dict[str, Any]:
    state = topic.state()
    subs: dict[str, dict[str, int]] = {}
    for name in topic.subscribers():
        hwm = topic.subscriber(name).hwm  # never registers one: works on a read-only view
        subs[name] = {"hwm": hwm, "lag": state.head_seq - hwm}
    return {
        "config": topic.config.to_dict(),
        "state": state.to_dict(),
        "subscribers": subs,
        "describe": dict(extras),
    }


def _router_report(store: Store, only: str | None) -> dict[str, Any]:
    """Every router (RTR-1), or those whose source or dest is ``only``: its creation
    arguments, cursor, lag and whether it is stalled (lag > 0; CLI-11)."""
    routers: dict[str, Any] = {}
    for info in store.routers():  # empty where the store has no routers (RTR-13)
        if only is not None and only not in (info.config.source, info.config.dest):
            continue
        facts = info.to_dict()
        del facts["name"]
        routers[info.name] = {**facts, "stalled": info.lag > 0}
    return routers


def _inspect_report(store: Store, only: str | None, view: bool) -> dict[str, Any]:
    facts = dict(store.describe())
    # The memory engine nests per-topic facts under "topics"; keep what the API does not show.
    per_topic = facts.pop("topics") if isinstance(facts.get("topics"), Mapping) else {}
    assert isinstance(per_topic, Mapping)
    names = [only] if only is not None else store.topics()
    topics: dict[str, Any] = {}
    for name in names:
        raw = per_topic.get(name)
        extras = (
            {k: v for k, v in raw.items() if k not in ("config", "state", "subscribers")}
            if isinstance(raw, Mapping)
            else {}
        )
        if cli_instances.is_instances(store):  # INST-13: per instance
            topics[name] = cli_instances.topic_report(store, name)
            continue
        topics[name] = _topic_report(store.topic(name, create=False), extras)
    caps = store.capabilities
    return {
        "uri": store.uri,
        # counters in "describe" are this process's: a read-only view has written nothing
        "read_only_view": view,
        "capabilities": fmt.jsonable(dataclasses.asdict(caps)),
        "describe": facts,
        "topics": topics,
        "routers": _router_report(store, only),
    }


@main.command("inspect")
@click.argument("uri")
@click.option("--topic", "only", metavar="NAME", help="Only this topic and its routers.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON (stable keys).")
def inspect_cmd(uri: str, only: str | None, as_json: bool) -> None:
    """Show topics (config, state, subscribers), routers (cursor, lag), backend facts and
    capabilities; with --topic, that topic and the routers into or out of it.

    Reads only (a file:// store, blockdev:// ring or sf:// slot through a read-only view, so a
    live writer may hold it) and never creates a store. Control characters are escaped as in `tail`.
    """
    with open_read_only(uri) as store:
        report = _inspect_report(store, only, has_read_only_view(uri))
    if as_json:
        click.echo(json.dumps(fmt.jsonable(report), indent=2, sort_keys=True))
    else:
        fmt.print_inspect(report)


# ---------------------------------------------------------------------------------------------
# append / tail
# ---------------------------------------------------------------------------------------------
def _max_record_bytes(uri: str) -> int:
    # Bounds how much of one stdin line is held in memory: a longer line is too_large anyway.
    raw = tidelog.parse_uri(uri).options.get("max_record_bytes", 64 << 20)
    return parse_size("max_record_bytes", raw)


@main.command("append")
@click.argument("uri")
@click.argument("topic")
@click.argument("payloads", nargs=-1, metavar="[PAYLOAD]...")
@click.option("--tag", help="Tag every record (spec DEL-2 deletes by tag).")
@click.option("--node", help="Origin node label of every record.")
@click.option(
    "--durability",
    type=click.Choice(DURABILITY_CLASSES),
    help="Durability class; only when creating the topic, else it must match (TOP-9).",
)
def append_cmd(
    uri: str,
    topic: str,
    payloads: tuple[str, ...],
    tag: str | None,
    node: str | None,
    durability: str | None,
) -> None:
    """Append each PAYLOAD (utf-8), or each line of stdin, as one record; print the seqs.

    Records are appended in batches (one append_many, one sync, for up to 1000 records or
    1 MiB that are already there), each batch's seqs printed once it returned. A batch the
    topic refuses for room or size is retried one record at a time, so what is appended and
    what fails are the same as with one append per line: the printed seqs are exactly the
    acknowledged records. After an io_error the failed batch may or may not be stored.
    """
    config: dict[str, Any] = {} if durability is None else {"durability": durability}
    max_line = _max_record_bytes(uri)
    with tidelog.open(uri) as store:
        handle = store.topic(topic, **config)
        records, size = cli_append.batch_bounds(handle)
        if payloads:
            encoded = (p.encode("utf-8") for p in payloads)
            batches = cli_append.chunked(encoded, records, size)
        else:
            batches = cli_append.line_batches(sys.stdin.buffer, records, size, max_line)
        if not cli_append.show_progress():
            cli_append.append_batches(handle, batches, tag, node, _print_seqs)
            return
        with cli_append.progress() as bar:
            task = bar.add_task("append", total=None, bytes=0)
            done = {"bytes": 0}

            def acknowledged(seqs: list[int], nbytes: int) -> None:
                _print_seqs(seqs, nbytes)
                done["bytes"] += nbytes
                bar.update(task, advance=len(seqs), bytes=done["bytes"])

            cli_append.append_batches(handle, batches, tag, node, acknowledged)


def _print_seqs(seqs: list[int], _bytes: int) -> None:
    click.echo("".join(f"{seq}\n" for seq in seqs), nl=False)


@main.command("tail")
@click.argument("uri")
@click.argument("topic")
@click.option(
    "--after",
    default=0,
    show_default=True,
    type=click.IntRange(min=0),
    help="Print items with seq above this.",
)
@click.option("--limit", type=click.IntRange(min=1), help="Stop after this many items.")
@click.option(
    "--follow",
    "-f",
    is_flag=True,
    help="Keep reading new records, also another process's, until Ctrl-C or SIGTERM.",
)
@click.option(
    "--interval",
    default=0.2,
    show_default=True,
    type=click.FloatRange(min=0.01, max=60.0),
    help="Seconds between looks for new records with --follow.",
)
@click.option(
    "--json", "as_json", is_flag=True, help="One JSON object per line; payloads in base64."
)
@click.option(
    "--cursor",
    help="A store of several instances: resume the merged read from this cursor (INST-8).",
)
def tail_cmd(
    uri: str,
    topic: str,
    after: int,
    limit: int | None,
    follow: bool,
    interval: float,
    as_json: bool,
    cursor: str | None,
) -> None:
    """Print records and tombstones (TMB-1: lost ranges are shown, never skipped).

    One item per line: seq, time, tag, node, payload, separated by tabs. Control characters,
    non-printable characters and backslashes in payloads, tags and nodes are escaped
    (\\n, \\t, \\r, \\\\, \\xNN, \\uNNNN; a byte that is not UTF-8 is \\xNN with NN >= 80; a
    missing tag or node is "-"), so every record is exactly one line; --json is exact.

    Reads only: a file:// store, blockdev:// ring or sf:// slot is opened as a read-only view (a
    live writer may hold it; with --follow its new records show up within about --interval), and
    nothing is created.
    """
    show: Callable[[Item], str] = (
        (lambda item: json.dumps(fmt.item_json(item))) if as_json else fmt.item_line
    )
    with open_read_only(uri) as store:
        handle = store.topic(topic, create=False)
        if cli_instances.is_instances(store):  # INST-14: the merged read
            shown: Callable[[Any], str] = (
                (lambda e: json.dumps(cli_instances.entry_json(e)))
                if as_json
                else cli_instances.entry_line
            )
            with contextlib.suppress(KeyboardInterrupt), sigterm_as_interrupt():
                cli_instances.tail_merged(
                    store, handle, cursor, after, limit, follow, interval, shown
                )
            return
        if cursor is not None:
            raise BadArgument("--cursor is for a store of several instances (INST-14)")
        if not follow:
            _tail(store, handle, after, limit, follow, interval, show)
            return
        # Ctrl-C or SIGTERM is how --follow ends: no error (CLI-1)
        with contextlib.suppress(KeyboardInterrupt), sigterm_as_interrupt():
            _tail(store, handle, after, limit, follow, interval, show)


def _tail(
    store: Store,
    handle: Topic,
    after: int,
    limit: int | None,
    follow: bool,
    interval: float,
    show: Callable[[Item], str],
) -> None:
    batch, cursor, left = 1000, after, limit
    while left is None or left > 0:
        want = batch if left is None else min(batch, left)
        items = handle.read(after=cursor, limit=want)
        if items:
            click.echo("".join(f"{show(item)}\n" for item in items), nl=False)
            cursor = fmt.item_end(items[-1])
        if left is not None:
            left -= len(items)
        if len(items) < want:  # a short read has passed head_seq (TOP-8)
            if not follow:
                return
            sys.stdout.flush()  # a pipe reader sees records as they come
            time.sleep(interval)
            store.refresh()  # a read-only view catches up with the writer (CLI-4, XPR-1)


# ---------------------------------------------------------------------------------------------
# demo
# ---------------------------------------------------------------------------------------------
@dataclass
class _Demo:
    """Shared counters of one demo run. Each thread writes only its own slots."""

    quotas: list[int]
    appended: list[int]
    retries: list[int]
    hits: list[list[int]]  # hits[sensor][counter]: times the consumer saw that reading
    consumed: int = 0
    tombstones: int = 0
    malformed: int = 0  # unparseable payload, tag/payload mismatch, or seq not increasing
    t0: float = 0.0
    t_in: float = 0.0  # seconds from start until the last producer finished
    t_out: float = 0.0  # seconds from start until the consumer drained everything
    stop: threading.Event = field(default_factory=threading.Event)
    errors: list[BaseException] = field(default_factory=list)

    @classmethod
    def plan(cls, records: int, producers: int) -> _Demo:
        quotas = [records // producers + (i < records % producers) for i in range(producers)]
        return cls(quotas, [0] * producers, [0] * producers, [[0] * q for q in quotas])


def _guard(demo: _Demo, work: Callable[[], None]) -> Callable[[], None]:
    """Run a thread body; on any error record it and stop the others (so none waits forever)."""

    def run() -> None:
        try:
            work()
        except BaseException as exc:  # re-raised in the main thread
            demo.errors.append(exc)
            demo.stop.set()

    return run


def _producer(demo: _Demo, topic: Topic, i: int, batch: int, seed: int | None) -> None:
    rng = random.Random(None if seed is None else f"{seed}-{i}")
    tag = f"sensor-{i}"
    counter, quota = 0, demo.quotas[i]
    while counter < quota and not demo.stop.is_set():
        n = min(batch, quota - counter)
        payloads = [
            b'{"sensor":%d,"reading":%.2f,"counter":%d}' % (i, 20.0 + rng.gauss(0.0, 2.0), c)
            for c in range(counter, counter + n)
        ]
        while not demo.stop.is_set():
            try:
                topic.append_many(payloads, tag=tag)
                break
            except Backpressure:  # the consumer lags: wait for it instead of losing data (SUB-6)
                demo.retries[i] += 1
                time.sleep(0.002)
        else:
            return
        counter += n
        demo.appended[i] = counter
    demo.t_in = max(demo.t_in, time.perf_counter() - demo.t0)


def _consumer(demo: _Demo, sub: Subscriber, producers: list[threading.Thread]) -> None:
    last_seq = 0
    while not demo.stop.is_set():
        # Read "done" before polling: an empty poll after every producer returned means drained.
        done = not any(p.is_alive() for p in producers)
        items = sub.poll(max=500)
        if not items:
            if done:
                break
            time.sleep(0.001)
            continue
        for item in items:
            if isinstance(item, Tombstone):
                demo.tombstones += 1
            else:
                _check_record(demo, item, last_seq)
                last_seq = item.seq
        sub.commit(fmt.item_end(items[-1]))  # trim="acked" frees the space producers wait for
    demo.t_out = time.perf_counter() - demo.t0


def _check_record(demo: _Demo, rec: Record, last_seq: int) -> None:
    demo.consumed += 1
    try:
        body = json.loads(rec.payload)
        sensor, counter = int(body["sensor"]), int(body["counter"])
        ok = rec.tag == f"sensor-{sensor}" and rec.seq > last_seq and counter >= 0
        demo.hits[sensor][counter] += 1
    except (ValueError, KeyError, IndexError, TypeError):
        ok = False
    if not ok:
        demo.malformed += 1


def _run_threads(demo: _Demo, topic: Topic, sub: Subscriber, batch: int, seed: int | None) -> None:
    records = sum(demo.quotas)
    demo.t0 = time.perf_counter()
    producers = [
        threading.Thread(
            target=_guard(demo, partial(_producer, demo, topic, i, batch, seed)),
            name=f"producer-{i}",
            daemon=True,
        )
        for i in range(len(demo.quotas))
    ]
    consumer = threading.Thread(
        target=_guard(demo, lambda: _consumer(demo, sub, producers)), name="consumer", daemon=True
    )
    columns = (
        TextColumn("{task.description:>8}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), refresh_per_second=8) as bar:
        appended = bar.add_task("appended", total=records)
        consumed = bar.add_task("consumed", total=records)
        for p in producers:
            p.start()
        consumer.start()
        try:
            while consumer.is_alive():
                bar.update(appended, completed=sum(demo.appended))
                bar.update(consumed, completed=demo.consumed)
                consumer.join(0.05)
        except KeyboardInterrupt:
            demo.stop.set()
            raise
        bar.update(appended, completed=sum(demo.appended))
        bar.update(consumed, completed=demo.consumed)
    for p in producers:
        p.join()


def _summary(demo: _Demo, topic: Topic, elapsed: float) -> bool:
    """Print the result; True when every record was consumed exactly once and nothing was lost."""
    state = topic.state()
    cfg = topic.config
    produced = sum(demo.appended)
    missing = sum(h.count(0) for h in demo.hits)
    duplicated = sum(n - 1 for h in demo.hits for n in h if n > 1)
    # trim="acked": once the only subscriber committed everything, nothing stays live (SUB-5),
    # and with backpressure nothing was ever evicted (evict_floor 1, no tombstone; SUB-6, TMB-1).
    drained = state.count == 0 and state.bytes == 0 and state.evict_floor == 1
    rows: list[tuple[str, object]] = [
        ("config", " ".join(f"{k}={fmt.show(getattr(cfg, k))}" for k in fmt.CONFIG_FIRST)),
        ("produced", produced),
        ("consumed", demo.consumed),
        ("duplicates", duplicated),
        ("missing", missing),
        ("malformed", demo.malformed),
        ("backpressure retries", sum(demo.retries)),
        ("tombstones", demo.tombstones),
        ("final state", " ".join(f"{k}={v}" for k, v in state.to_dict().items())),
        ("elapsed", f"{elapsed:.2f} s"),
        ("rate in", f"{produced / max(demo.t_in, 1e-9):,.0f} records/s"),
        ("rate out", f"{demo.consumed / max(demo.t_out, 1e-9):,.0f} records/s"),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        click.echo(f"  {key:<{width}}  {value}")
    ok = (
        produced == sum(demo.quotas)
        and missing == 0
        and duplicated == 0
        and demo.malformed == 0
        and demo.tombstones == 0
        and drained
    )
    if ok:
        click.echo(f"OK: {produced} records, 0 lost, 0 duplicated, every record consumed once")
    else:
        click.echo(
            f"FAILED: {missing} lost, {duplicated} duplicated, {demo.malformed} malformed, "
            f"{demo.tombstones} tombstones, drained={fmt.show(drained)}"
        )
    return ok


@main.command("demo-local")
@click.option("--uri", default="memory://", show_default=True, help="Store to run against.")
@click.option("--records", default=20_000, show_default=True, type=click.IntRange(min=1))
@click.option("--producers", default=4, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--batch",
    default=100,
    show_default=True,
    type=click.IntRange(min=1),
    help="Records per append_many.",
)
@click.option("--topic", "topic_name", default="demo", show_default=True)
@click.option("--seed", type=int, help="Seed for the readings (thread interleaving still varies).")
def demo_cmd(
    uri: str, records: int, producers: int, batch: int, topic_name: str, seed: int | None
) -> None:
    """In-process pipeline, no Spark: producers -> capped topic -> durable subscriber; verified.
    (``tidelog demo`` is the Spark pipeline; ``tidelog demo --local`` runs this one.)

    Producers append synthetic sensor readings in batches; one consumer drains them through the
    subscriber "exporter" and commits. The topic's cap is a quarter of the records with
    retention=backpressure, so producers must wait (and retry) whenever the consumer lags. At the
    end every reading must have been consumed exactly once; else the exit status is 1.
    """
    demo = _Demo.plan(records, producers)
    with tidelog.open(uri) as store:
        if topic_name in store.topics():
            # The check counts every record of the topic: old ones would read as corruption.
            raise click.UsageError(
                f"topic {topic_name!r} already exists in {store.uri}; pick another --topic"
            )
        cap = max(records // 4, batch)  # a batch above the cap would be too_large (RET-5)
        topic = store.topic(
            topic_name, cap_records=cap, discard="old", retention="backpressure", trim="acked"
        )
        # Register before any append: without a subscriber, the cap would evict, not push back.
        sub = topic.subscribe("exporter", start="earliest")
        click.echo(
            f"tidelog demo: {producers} producers -> topic {topic_name!r} on {store.uri} "
            f"(cap_records={cap}) -> subscriber 'exporter'"
        )
        t0 = time.perf_counter()
        _run_threads(demo, topic, sub, batch, seed)
        if demo.errors:
            raise demo.errors[0]
        ok = _summary(demo, topic, time.perf_counter() - t0)
    if not ok:
        raise SystemExit(EXIT_FAILED)


# ---------------------------------------------------------------------------------------------
# verify
# ---------------------------------------------------------------------------------------------
@main.command("verify")
@click.argument("target")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON.")
@click.option("--cold", metavar="URL", help="The store's cold tier: check its objects too.")
def verify_cmd(target: str, as_json: bool, cold: str | None) -> None:
    """Check every checksum and structure of a store directory, SF slot, .qseg segment or
    blockdev ring image (or a file://, blockdev:// URI) offline, whoever wrote it.

    Prints each problem with its file, byte offset and spec rule; exits 1 if any is an error
    (warnings, such as a torn WAL tail that recovery discards, exit 0). A URI whose scheme
    keeps no files (memory://, model://) is an error (exit 2), not a check of this directory.
    A cold+URL checks a cold tier alone; --cold URL a store's cold tier with the store
    (orphan objects are shown as info, not damage).
    """
    from tidelog.verify import verify_cold, verify_path

    if target.lower().startswith(COLD_PREFIX):
        report = verify_cold(target)
    else:
        report = verify_path(file_location(target), cold=cold)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "root": report.root,
                    "ok": report.ok,
                    "files_checked": report.files_checked,
                    "problems": [dataclasses.asdict(p) for p in report.problems],
                },
                indent=2,
            )
        )
    else:
        for p in report.problems:
            click.echo(fmt.escape(str(p)))
        verdict = "OK" if report.ok else "FAILED"
        click.echo(
            f"{verdict}: {report.files_checked} files checked, "
            f"{len(report.errors)} errors, {len(report.warnings)} warnings"
        )
    if not report.ok:
        raise SystemExit(EXIT_FAILED)


# ---------------------------------------------------------------------------------------------
# version
# ---------------------------------------------------------------------------------------------
@main.command("version")
def version_cmd() -> None:
    """Print the tidelog version."""
    click.echo(f"tidelog {tidelog.__version__}")


# Commands of optional parts register themselves on ``main`` when their module is importable
# (each area owns its module: tidelog/cli_<area>.py).
for _module in (
    "tidelog.cli_blockdev",
    "tidelog.cli_forward",
    "tidelog.cli_spark",
    "tidelog.cli_conformance",
    "tidelog.cli_bench",
    "tidelog.cli_repair",
):
    try:
        __import__(_module)
    except ModuleNotFoundError as _exc:
        if _exc.name != _module:
            raise


if __name__ == "__main__":  # pragma: no cover - `python -m tidelog.cli`
    # Run the group of the *imported* module: optional commands (tidelog.cli_spark's `demo`, ...)
    # register themselves on ``tidelog.cli.main``, not on this ``__main__`` copy.
    from tidelog.cli import main as _main

    _main()
