"""The Spark adapter's pieces without a Spark session (no JVM): options, schemas, the stream
reader's offset logic against a live owner, checkpoint parsing, staging, the demo's check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import tidelog
from tidelog.adapters.spark import committed_offset
from tidelog.adapters.spark.columns import log_schema, slot_batch, spark_compatible, staged_table
from tidelog.adapters.spark.options import parse_options
from tidelog.adapters.spark.staging import stage
from tidelog.errors import BadArgument, BadName, BadOption
from tidelog.hooks import Checkpoint, EngineTopics, hooks


def test_SPK_1_importable_without_pyspark() -> None:
    """SPK-1: `import tidelog.adapters.spark` never imports pyspark; using it without pyspark
    raises NotAvailable naming the extra."""
    code = (
        "import sys; sys.modules['pyspark'] = None\n"
        "import tidelog, tidelog.adapters.spark as s\n"
        "assert not s.available()\n"
        "try:\n    s.register(object())\nexcept tidelog.NotAvailable as e:\n    print(e.code, e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert out.startswith("not_available") and "tidelog[spark]" in out


def test_SPK_3_arrow_schemas_match_what_spark_expects() -> None:
    """SPK-3: Spark compares the first batch's schema with Schema.equals:
    the adapter's Arrow schema must be exactly to_arrow_schema(the DDL, tz=UTC)."""
    pytest.importorskip("pyspark")
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import (
        BinaryType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    fields = [
        StructField("topic", StringType()),
        StructField("seq", LongType()),
        StructField("ts", TimestampType()),
        StructField("tag", StringType()),
        StructField("node", StringType()),
        StructField("payload", BinaryType()),
    ]
    assert to_arrow_schema(StructType(fields), timezone="UTC").equals(log_schema(False))
    with_gap = StructType([*fields, StructField("gap_to", LongType())])
    assert to_arrow_schema(with_gap, timezone="UTC").equals(log_schema(True))


def test_SPK_5_spark_compatible_types_and_slot_batches() -> None:
    assert spark_compatible(pa.dictionary(pa.int8(), pa.string())) == pa.string()
    assert spark_compatible(pa.uint32()) == pa.int64()
    assert spark_compatible(pa.timestamp("ms", tz="UTC")) == pa.timestamp("us", tz="UTC")
    assert spark_compatible(pa.list_(pa.uint8())) == pa.list_(pa.field("element", pa.int16()))
    with pytest.raises(BadArgument, match="no Spark equivalent"):
        spark_compatible(pa.month_day_nano_interval())
    target = pa.schema([("_seq", pa.int64()), ("a", pa.int64()), ("b", pa.string())])
    got = slot_batch(7, pa.record_batch({"a": pa.array([1, 2], pa.uint8())}), target)
    assert got.schema.equals(target) and got.to_pydict() == {
        "_seq": [7, 7],
        "a": [1, 2],
        "b": [None, None],
    }


def test_SPK_options_are_checked_before_any_task_runs(tmp_path: Path) -> None:
    opts = parse_options({"path": str(tmp_path / "s"), "topic": "ev", "checkpointLocation": "x"})
    assert opts.root == str(tmp_path / "s") and opts.from_seq is None
    assert opts.staging == str(tmp_path / ".s.spark-staging")  # outside the store (LAY-2)
    assert parse_options({"uri": "file://./rel", "topic": "ev"}).root == os.path.abspath("rel")
    t = parse_options({"path": "/x", "topic": "ev", "fromTs": "1970-01-01T00:00:01"})
    assert t.from_ts == 1000
    cases: list[tuple[dict[str, str], type[Exception], str]] = [
        ({"path": "/x"}, BadOption, "topic"),
        ({"topic": "ev"}, BadOption, "no store"),
        ({"path": "memory://x", "topic": "ev"}, BadOption, "file://"),
        ({"path": "/x", "topic": "ev", "maxRecordPerTrigger": "5"}, BadOption, "unknown"),
        ({"path": "/x", "topic": "ev", "slot": "64"}, BadOption, "0..63"),
        ({"path": "/x", "topic": "ev", "tombstones": "skip"}, BadOption, "fail, rows"),
        ({"path": "/x", "topic": "ev", "startingOffsets": "soon"}, BadOption, "latest"),
        ({"path": "/x", "topic": "../ev"}, BadName, "topic"),
        ({"path": "/x", "topic": "ev", "partitionBytes": "0"}, BadOption, "partitionBytes"),
        ({"path": "/x", "topic": "ev", "partitionBytes": "lots"}, BadOption, "partitionBytes"),
    ]
    for options, error, match in cases:
        with pytest.raises(error, match=match):
            parse_options(options)


def test_SPK_3_tasks_are_sized_by_payload_bytes_unless_partition_records_is_given(
    tmp_path: Path,
) -> None:
    """SPK-3: without partitionRecords the read is cut evenly into ceil(volume /
    partitionBytes) tasks (default 128 MiB), at least one seq each; partitionRecords overrides
    it; the ranges tile the read exactly."""
    pytest.importorskip("pyspark")
    from pyspark.sql.types import StructType

    from tidelog.adapters.spark.source import TidelogReader

    root = tmp_path / "s"
    with tidelog.open(f"file://{root}") as store:
        store.topic("ev").append_many([b"x" * 100] * 9 + [b"y" * 200])  # mean 110 bytes

    def ranges(**extra: str) -> list[tuple[int, int]]:
        opts = parse_options({"path": str(root), "topic": "ev", **extra})
        reader = TidelogReader(opts, StructType.fromJson(_log_struct()))
        return [(p.lo, p.hi) for p in reader.partitions()]  # type: ignore[attr-defined]

    assert parse_options({"path": "/x", "topic": "ev"}).partition_bytes == 128 << 20
    assert ranges() == [(1, 10)]
    assert ranges(partitionBytes="330") == [(1, 3), (4, 6), (7, 8), (9, 10)]  # 4 tasks, even
    assert ranges(partitionBytes="50") == [(q, q) for q in range(1, 11)]  # at least one seq
    assert ranges(partitionBytes="330", partitionRecords="4") == [(1, 4), (5, 8), (9, 10)]


def test_SPK_3_tasks_are_cut_evenly_and_for_parallelism_down_to_4_mib(tmp_path: Path) -> None:
    """SPK-3: 2M records of 100 B at 128 MiB per task make two tasks of 1M records (before:
    1,342,177 and 657,823, and a scan lasted as long as the longer); minPartitions (default the
    host's CPU count) cuts a smaller read into more tasks while each keeps 4 MiB of payload, so a
    small read stays one task."""
    pytest.importorskip("pyspark")
    from tidelog.adapters.spark import reading
    from tidelog.adapters.spark.source import _task_count

    assert reading.split_even(1, 2_000_000, 2) == [(1, 1_000_000), (1_000_001, 2_000_000)]
    assert reading.split_even(5, 14, 3) == [(5, 8), (9, 11), (12, 14)]
    assert reading.split_even(1, 2, 5) == [(1, 1), (2, 2)]  # at most one task per seq
    root = tmp_path / "s"
    with tidelog.open(f"file://{root}") as store:
        store.topic("ev").append_many([b"x" * 100] * 10)

    def count(seqs: int, **extra: str) -> int:
        return _task_count(parse_options({"path": str(root), "topic": "ev", **extra}), seqs)

    assert count(2_000_000, minPartitions="1") == 2  # 200 MB at 128 MiB
    assert count(2_000_000, minPartitions="8") == 8
    assert count(1_000_000, minPartitions="2") == 2  # 100 MB: one task per core
    assert count(100_000, minPartitions="8") == 2  # 10 MB: no task below 4 MiB
    assert count(10, minPartitions="8") == 1
    assert count(1_000_000) == max(1, min(os.cpu_count() or 1, 23))


def test_SPK_6_staged_rows(tmp_path: Path) -> None:
    """SPK-6: the staged file is XPR-4's Arrow stream; an empty task stages nothing."""
    (tmp_path / "st").mkdir()
    assert stage(str(tmp_path / "st"), iter([]), None) == ("", 0)
    assert not list((tmp_path / "st").iterdir())
    batch = pa.record_batch({"payload": ["a", "b"], "tag": ["t", None], "other": [1, 2]})
    path, rows = stage(str(tmp_path / "st"), iter([batch]), None)
    assert rows == 2
    table = pa.ipc.open_stream(Path(path).read_bytes()).read_all()
    assert table.to_pydict() == {"payload": [b"a", b"b"], "tag": ["t", None], "node": [None] * 2}
    with pytest.raises(BadArgument, match="'payload' column"):
        staged_table(pa.record_batch({"x": [1]}), None)


def test_SPK_7_abort_while_tasks_still_write_leaves_nothing(tmp_path: Path) -> None:
    """SPK-7, the race of a task still writing when the driver aborts: once abort returns no
    staged file is visible, the straggler finishes into an unlinked file, a task that starts
    after the abort fails (StagingGone) without creating anything, and a task that fails
    mid-write removes its own partial file. The attempt directory is created when the writer
    is shipped to its tasks, never by a task."""
    pytest.importorskip("pyspark")
    import pickle
    import threading

    from tidelog.adapters.spark.source import TidelogWriter
    from tidelog.adapters.spark.staging import StagingGone

    root = tmp_path / "s"
    staging = tmp_path / ".s.spark-staging"
    opts = parse_options({"path": str(root), "topic": "w"})
    writer = TidelogWriter(opts)
    assert not staging.exists()  # planned, not shipped: nothing created
    task = pickle.loads(pickle.dumps(writer))  # what an executor gets
    driver = pickle.loads(pickle.dumps(writer))  # what commit/abort get: the same attempt
    (attempt,) = staging.iterdir()

    started, release = threading.Event(), threading.Event()
    batch = pa.record_batch({"payload": [b"x", b"y"]})

    def slow_rows() -> Any:
        yield batch
        started.set()
        release.wait(30)
        yield batch

    result: list[Any] = []
    straggler = threading.Thread(target=lambda: result.append(task.write(slow_rows())))
    straggler.start()
    assert started.wait(30)
    assert [p.name.startswith("part-") for p in attempt.iterdir()] == [True]
    driver.abort([None])
    assert not staging.exists()  # nothing staged is visible any more
    release.set()
    straggler.join(30)
    assert result and result[0].rows == 4  # it finished, into a file nobody can see
    assert not os.path.exists(result[0].path) and not staging.exists()
    with pytest.raises(StagingGone, match="aborted"):
        task.write(iter([batch]))  # a task starting after the abort creates nothing
    assert not staging.exists()

    failing = pickle.loads(pickle.dumps(TidelogWriter(opts)))
    with pytest.raises(BadArgument, match="holds nulls"):
        failing.write(iter([batch, pa.record_batch({"payload": pa.array([None], pa.binary())})]))
    (attempt,) = staging.iterdir()
    assert list(attempt.iterdir()) == []  # the failed task removed its partial file


def test_SPK_8_to_10_stream_reader_offsets_against_a_live_owner(tmp_path: Path) -> None:
    """SPK-8: offsets are seqs, batch (start, end] is one range per partitionRecords, empty
    when start == end. SPK-9: initialOffset registers the subscriber and is deterministic
    (Spark asks twice); latestOffset honours ReadMaxRows and the availableNow target.
    SPK-10 and SPK-2: commit(end) is a request the owning process applies: the subscriber
    advances and the topic trims."""
    pytest.importorskip("pyspark")
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
    from pyspark.sql.types import StructType

    from tidelog.adapters.spark.source import SeqRange, TidelogStreamReader

    root = tmp_path / "s"
    with tidelog.open(f"file://{root}?progress_flush_ms=10") as store:
        t = store.topic("ev")
        t.append_many([b"x"] * 10)
        opts = parse_options({"path": str(root), "topic": "ev", "startingOffsets": "latest"})
        reader = TidelogStreamReader(opts, StructType.fromJson(_log_struct()))
        assert reader.initialOffset() == {"seq": 10}
        assert t.subscriber("spark").hwm == 10  # registered before the first batch
        t.append_many([b"y"] * 10)
        assert reader.initialOffset() == {"seq": 10}  # deterministic
        assert reader.latestOffset({"seq": 10}, ReadMaxRows(4)) == {"seq": 14}
        assert reader.latestOffset({"seq": 14}, ReadAllAvailable()) == {"seq": 20}
        reader.prepareForTriggerAvailableNow()
        t.append_many([b"z"] * 5)
        assert reader.latestOffset({"seq": 20}, ReadAllAvailable()) == {"seq": 20}  # target
        parts = reader.partitions({"seq": 10}, {"seq": 20})
        assert [(p.lo, p.hi) for p in parts] == [(11, 20)]  # type: ignore[attr-defined]
        assert reader.partitions({"seq": 20}, {"seq": 20}) == []
        assert sum(b.num_rows for b in reader.read(SeqRange(11, 20))) == 10
        reader.commit({"seq": 15})
        assert t.subscriber("spark").hwm == 15
        # trimmed: min(base) = 10 < seq <= 15; 1..10 predate the subscriber and stay (SUB-5)
        assert t.state().count == 20
        assert [r.seq for r in t.read(after=9, limit=3)] == [10, 16, 17]  # type: ignore[union-attr]
        copy = __import__("pickle").loads(__import__("pickle").dumps(reader))
        assert copy._initial is None  # runner state is not shipped to executors


def _log_struct() -> dict[str, Any]:
    def f(name: str, t: str) -> dict[str, Any]:
        return {"name": name, "type": t, "nullable": True, "metadata": {}}

    return {
        "type": "struct",
        "fields": [
            f("topic", "string"),
            f("seq", "long"),
            f("ts", "timestamp"),
            f("tag", "string"),
            f("node", "string"),
            f("payload", "binary"),
        ],
    }


def test_SPK_10_committed_offset_from_a_checkpoint(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    assert committed_offset(str(ck)) is None
    (ck / "offsets").mkdir(parents=True)
    (ck / "commits").mkdir()
    for batch, seq in ((0, 30), (1, 60), (2, 90)):
        meta = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 1})
        (ck / "offsets" / str(batch)).write_text(f'v1\n{meta}\n{{"seq": {seq}}}\n')
    for batch in (0, 1):  # batch 2 planned (offset logged) but not committed by the sink
        (ck / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')
    assert committed_offset(str(ck)) == 60


def test_demo_check_catches_lost_and_duplicated_rows() -> None:
    """The demo's own verification (exit status 1 on failure)."""
    from tidelog.adapters.spark.demo import DemoConfig, _verify

    cfg = DemoConfig(records=2, rows=2, producers=1)
    good = pa.table(
        {
            "_seq": [1, 1, 2, 2],
            "sensor": [0, 0, 0, 0],
            "bundle": [0, 0, 1, 1],
            "row": [0, 1, 0, 1],
            "temperature": [1.0] * 4,
        }
    )
    assert _verify(good, cfg, [2], head=2) == []
    dup = pa.concat_tables([good, good.slice(0, 1)])
    assert any("duplicated" in p for p in _verify(dup, cfg, [2], head=2))
    lost = good.slice(0, 3)
    assert any("missing rows" in p for p in _verify(lost, cfg, [2], head=2))


# -- the columnar reader of sealed segments (fastread) ---------------------------------------------
def _label(i: int) -> tuple[str | None, str | None]:
    tags = [None, "x", "t", "tag-long-enough-to-leave-inline", "ünï"]
    nodes = [None, "n", "twelve-bytes", "node-name-longer-than-twelve"]
    return tags[i % 5], nodes[i % 4]


def _tables(opts: Any, lo: int, hi: int) -> pa.Table:
    from tidelog.adapters.spark import reading

    batches = list(reading.read_log(opts, lo, hi))
    return pa.Table.from_batches(batches, schema=log_schema(opts.tombstones == "rows"))


def _columnar(opts: Any, lo: int, hi: int, monkeypatch: pytest.MonkeyPatch) -> pa.Table:
    """``lo..hi`` read by the columnar paths, checked equal to the public read path's."""
    from tidelog.adapters.spark import fastread

    fast = _tables(opts, lo, hi)
    with monkeypatch.context() as m:
        m.setattr(fastread, "available", lambda: False)
        slow = _tables(opts, lo, hi)
    assert fast.equals(slow), (opts, lo, hi)
    return fast


def test_SPK_3_columnar_segment_reads_equal_the_public_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPK-3: the columnar reader of sealed segments returns exactly what Topic.read returns:
    labels (None, UTF-8, inline and out-of-line lengths), empty and large payloads, dead
    slots inside segments (deleted, trimmed: silent), dropped segments, and the unsealed tail."""
    from tidelog.adapters.spark import reading

    root = tmp_path / "s"
    writer = tidelog.open(f"file://{root}?segment_max_records=7&background=false")
    t = writer.topic("ev", cap_records=200)
    for i in range(60):
        tag, node = _label(i)
        t.append(bytes([i % 256]) * (i * 7 % 40), tag=tag, node=node)
    t.delete(tag="t")  # voluntary removals inside sealed segments
    t.delete(before_seq=10)  # the first segment is all dead and dropped at the checkpoint
    sub = t.subscribe("s", start="earliest")
    sub.commit(30)  # trim="acked": silent removals
    hooks(writer, Checkpoint).checkpoint()
    t.append_many([b"tail"] * 5, tag="tail")  # unsealed: the tail's own columnar path
    assert len(hooks(writer, EngineTopics).topics["ev"].log.chunks) >= 3
    try:
        for rows in ("fail", "rows"):
            opts = parse_options({"path": str(root), "topic": "ev", "tombstones": rows})
            for lo, hi in [(1, 65), (10, 65), (31, 40), (33, 33), (44, 62), (60, 65)]:
                fast = _columnar(opts, lo, hi, monkeypatch)
                public = reading.topic(opts).read(after=lo - 1, limit=1000)
                assert fast.num_rows == len([r for r in public if r[0] <= hi])
            runs, resume = reading._sealed_runs(opts, 10, 65)
            assert len(runs) >= 3 and resume == 61  # sealed runs columnar; the tail is not a run
    finally:
        writer.close()


def test_SPK_3_columnar_reads_of_the_unsealed_tail_equal_the_public_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPK-3: the unsealed tail (records only in the WAL, which a read-only view replays into
    memory) is read column by column too, and returns exactly what Topic.read returns: mixed
    labels, empty payloads, several ts, dead slots (deleted at the start, middle and end;
    trimmed), ranges across the sealed segments and the tail, every batch size; a view whose
    head is below the range's end still fails rather than return short (SPK-15)."""
    from tidelog.adapters.spark import reading
    from tidelog.adapters.spark.guard import StaleView
    from tidelog.clock import FakeClock

    root = tmp_path / "s"
    clock = FakeClock(1_700_000_000_000)
    writer = tidelog.open(f"file://{root}?segment_max_records=16&background=false", clock=clock)
    t = writer.topic("ev")
    try:
        t.append_many([b"sealed-%d" % i for i in range(40)], tag="s")
        hooks(writer, Checkpoint).checkpoint()  # 1..40 in segments; the rest stays in the WAL
        for i in range(60):
            tag, node = _label(i)
            t.append(bytes([i % 256]) * (i * 7 % 40), tag=tag, node=node)
            clock.advance(3)
        t.append_many([b"run-%d" % i for i in range(30)], tag="r", node="n")
        t.append_many([b""] * 10)
        t.delete(tag="t")  # dead slots all over the tail
        t.delete(before_seq=45)  # and at its start
        assert len(hooks(writer, EngineTopics).topics["ev"].log.chunks) >= 2
        for batch in ("7", "65536"):
            opts = parse_options({"path": str(root), "topic": "ev", "batchRecords": batch})
            for lo, hi in [(1, 140), (30, 50), (41, 140), (45, 45), (100, 139), (131, 140)]:
                _columnar(opts, lo, hi, monkeypatch)
            tail, resume = reading._tail(opts, 41, 140)
            assert tail is not None and resume == 141  # served column by column
        with pytest.raises(StaleView, match="its head 140, the plan's end 150"):
            list(reading.read_log(opts, 100, 150))
    finally:
        writer.close()


def test_SPK_3_columnar_reads_of_fixed_size_runs_equal_the_public_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPK-3, SEG-11, SEG-12: runs of equal-size frames (payloads gathered at one stride) and
    batches that cross label runs, dead slots and size changes read exactly as Topic.read."""

    root = tmp_path / "s"
    with tidelog.open(f"file://{root}?segment_max_records=500") as store:
        t = store.topic("ev")
        t.append_many([b"%08d" % i for i in range(300)])  # one run, one size
        t.append_many([b"%08d" % i for i in range(300)], tag="a", node="n")
        t.append_many([b"x" * (i % 3) for i in range(100)], tag="a", node="n")  # sizes vary
        t.append_many([b""] * 50)  # empty payloads at a stride
        t.delete(tag="a", before_seq=450)  # a dead stretch inside a run
    for batch in ("7", "128", "65536"):
        opts = parse_options({"path": str(root), "topic": "ev", "batchRecords": batch})
        for lo, hi in [(1, 750), (290, 310), (449, 455), (600, 750), (701, 750)]:
            _columnar(opts, lo, hi, monkeypatch)


def test_SPK_3_columnar_reads_verify_every_frame(tmp_path: Path) -> None:
    """SEG-2 holds on the fast path too: a flipped payload byte is Corrupt, never data."""
    from tidelog.adapters.spark import reading
    from tidelog.errors import Corrupt

    root = tmp_path / "s"
    with tidelog.open(f"file://{root}") as store:
        store.topic("ev").append_many([b"payload-%03d" % i for i in range(50)])
    (seg,) = root.glob("topics/*/seg-*.data")
    raw = bytearray(seg.read_bytes())
    raw[raw.index(b"payload-017") + 9] ^= 0x01
    seg.write_bytes(bytes(raw))
    opts = parse_options({"path": str(root), "topic": "ev"})
    assert reading._sealed_runs(opts, 1, 50)[0]
    with pytest.raises(Corrupt, match="XXH3"):
        list(reading.read_log(opts, 1, 50))


def test_SPK_5_slot_reads_of_sealed_qseg_segments_equal_the_public_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPK-5 over QSEG-11: a slot read takes the bundles of sealed Quiver segments zero-copy
    from the mapped files, and returns exactly what decoding the records Topic.read returns
    gives (drift, dictionaries, removed bundles, the unsealed tail)."""
    from tidelog.adapters.spark import fastread, reading
    from tidelog.adapters.spark.columns import slot_schema
    from tidelog.bundle import RecordBundle

    root = tmp_path / "s"
    writer = tidelog.open(f"file://{root}?segment_max_records=3&background=false")
    t = writer.topic("b", payload="bundles")
    for i in range(12):
        cols: dict[str, Any] = {"n": pa.array([i, i], pa.uint8())}
        if i >= 5:
            cols["d"] = pa.DictionaryArray.from_arrays(pa.array([0, 1], pa.int8()), ["x", "y"])
        t.append_bundle(RecordBundle({0 if i % 4 else 1: pa.record_batch(cols)}))
    t.delete(before_seq=3)
    hooks(writer, Checkpoint).checkpoint()
    t.append_bundle(RecordBundle({0: pa.record_batch({"n": pa.array([99], pa.uint8())})}))
    try:
        opts = parse_options({"path": str(root), "topic": "b", "slot": "0", "batchRecords": "5"})
        target = slot_schema(reading.infer_slot_columns(opts))
        runs, resume = reading._sealed_runs(opts, 1, 13, fastread.is_qseg_chunk)
        assert len(runs) >= 3 and resume == 13  # sealed: Quiver segments; 13: the tail

        def table() -> pa.Table:
            return pa.Table.from_batches(list(reading.read_slot(opts, 1, 13, target)), target)

        fast = table()
        with monkeypatch.context() as m:
            m.setattr(fastread, "available", lambda: False)
            slow = table()
        assert fast.equals(slow) and fast.num_rows == 2 * 8 + 1  # seqs 3,4,6,7,8,10,11,12; 13
        assert fast.column("_seq").to_pylist()[-1] == 13
    finally:
        writer.close()


def test_SPK_3_columnar_reads_of_run_frames_join_contiguous_payloads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPK-3, SEG-14, SEG-17: payloads of run frames lie back to back within each frame, so the
    columnar reader joins a slice per contiguous piece (variable sizes, empty payloads, label
    changes, frames cut at 64 KiB, deleted slots splitting pieces); the result equals the
    public read's."""
    from tidelog.adapters.spark import fastread

    root = tmp_path / "s"
    with tidelog.open(f"file://{root}?background=false") as writer:
        t = writer.topic("ev")
        t.append_many([bytes([i % 251]) * (i * 37 % 300) for i in range(1500)], tag="a")
        t.append_many([b"n%d" % i for i in range(300)], tag="b", node="n")
        t.append_many([bytes(i % 7) for i in range(200)])
        t.delete(before_seq=50)  # a dead prefix inside the first frame
    with tidelog.open(f"file://{root}?background=false") as writer:
        writer.topic("ev", create=False).delete(tag="b")  # a hole: a whole label run dies
    joined: list[int] = []
    real = fastread._contiguous

    def spy(*args: Any) -> Any:
        out = real(*args)
        if out is not None:
            joined.append(len(out))
        return out

    monkeypatch.setattr(fastread, "_contiguous", spy)
    opts = parse_options({"path": str(root), "topic": "ev", "batchRecords": "700"})
    for lo, hi in [(1, 2000), (5, 1499), (1400, 1900), (1801, 2000), (333, 333)]:
        fast = _tables(opts, lo, hi)
        with monkeypatch.context() as m:
            m.setattr(fastread, "available", lambda: False)
            slow = _tables(opts, lo, hi)
        assert fast.equals(slow), (lo, hi)
    assert sum(joined) > 1000  # most rows went through the joined pieces
