"""Golden vectors of tidelog's on-disk formats (spec/CONFORMANCE.md §5):
``tidelog conformance vectors --out DIR``.

Two kinds of vector, each a manifest entry (``manifest.json``):

* **files**: one file of one format, built with the format's *encoder* from known inputs, valid
  or deliberately broken (torn, bad checksum, bad magic, overflowing length, gap). ``decode`` is
  what a reader must get (the inputs, or where a tolerant scanner stops and why), or ``error``
  is the typed error it must raise (``code``, and the spec ``rule`` where the codec names one).
* **containers**: a store directory, an SF slot, a blockdev ring image, written by tidelog's
  backends, then optionally damaged. ``verify`` is what ``tidelog verify`` must report: whether
  it passes, and exactly which rule ids come out as errors and as warnings (from the spec, not
  from running the verifier). A valid container also carries ``content``: what a reader
  recovers from it (the records and subscriber positions the writer had).

``decode_file(format, data, params)`` is the reference decoder the test (and any other
implementation's test harness, via the manifest) checks against. Informational fields (store
ids, ring ids, creation times, lock PIDs) differ between runs; the manifest records the
semantics, so it always matches the bytes written alongside it.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from typing import Any

import tidelog
from tidelog.clock import FakeClock
from tidelog.errors import TidelogError
from tidelog.fsio import OsFS
from tidelog.hooks import Abandon, Checkpoint, hooks

__all__ = ["Vector", "write_vectors", "decode_file", "FORMATS", "store_content"]

FORMATS = (
    "wal", "segment-data", "segment-idx", "snapshot", "progress", "sf-segment", "ack-watermark",
    "qseg", "blockdev-slot", "blockdev-page", "file-store", "sf-slot", "blockdev-image",
)  # fmt: skip

_STORE_ID = bytes(range(16))
_T0 = 1_700_000_000_000


@dataclass
class Vector:
    path: str  # relative to the output directory
    format: str
    valid: bool
    what: str  # what the vector is, or how it was broken
    decode: Any = None  # expected decode (files)
    error: dict[str, Any] | None = None  # expected typed error of the decoder (files)
    params: dict[str, Any] = field(default_factory=dict)  # decoder parameters (files)
    verify: dict[str, Any] | None = None  # {"ok", "errors": [rules], "warnings": [rules]}
    content: Any = None  # what a reader recovers (valid containers)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None and v != {}}


def _verify(
    ok: bool, errors: tuple[str, ...] = (), warnings: tuple[str, ...] = ()
) -> dict[str, Any]:
    return {"ok": ok, "errors": sorted(errors), "warnings": sorted(warnings)}


def _err(code: str, rule: str | None = None) -> dict[str, Any]:
    return {"code": code, "rule": rule}


# =============================================================================================
# reference decoders (every format): bytes -> JSON, or a TidelogError
# =============================================================================================
def _text(b: bytes | memoryview) -> str:
    return bytes(b).hex()


def decode_file(fmt: str, data: bytes, params: dict[str, Any] | None = None) -> Any:
    """Decode one file of format ``fmt`` into JSON-able values; raises the codec's typed error."""
    params = params or {}
    if fmt == "wal":
        from tidelog.backends.file.format import wal

        wh = wal.decode_header(data)
        r = wal.scan(data, seed=wal.frame_seed(wh))
        return {
            "header": {"gen": wh.gen, "shard": wh.shard, "shard_count": wh.shard_count,
                       "created_ms": wh.created_ms, "store_id": wh.store_id.hex()},
            "frames": [
                {"type": f.type, "flags": f.flags, "topic_id": f.topic_id, "seq": f.seq,
                 "ts": f.ts, "tag": f.tag, "node": f.node, "data": _text(f.data),
                 "offset": f.offset}
                for f in r.frames
            ],
            "end": r.end,
            "status": r.status,
        }
    if fmt == "segment-data":
        from tidelog.backends.file.format import segment as seg

        scan = seg.scan_data(data)
        records = []
        for f in scan.frames:
            if scan.runs is None:  # version 1: one frame per record, offset of its frame
                q, ts, tag, node, payload = seg.read_record(data, f.offset, f.length, f.seq)
            else:  # version 2 (FORMATS-seg3.md): checked by run, offset of the payload
                q, ts, tag, node = f.seq, f.ts, f.tag, f.node
                payload = memoryview(data)[f.offset : f.offset + f.length]
            records.append({"seq": q, "ts": ts, "tag": tag, "node": node,
                            "payload": _text(payload), "offset": f.offset})
        problem = None if scan.problem is None else {"rule": scan.problem.rule,
                                                     "offset": scan.problem.offset}
        return {"topic_id": scan.header.topic_id, "first_seq": scan.header.first_seq,
                "records": records, "problem": problem}
    if fmt == "segment-idx":
        from tidelog.backends.file.format import segment as seg

        ix = seg.read_index(data)
        return {"topic_id": ix.topic_id, "first_seq": ix.first_seq,
                "entries": [[int(ix.offsets[i]), int(ix.lengths[i]), int(ix.tss[i]),
                             int(ix.flags[i])] for i in range(ix.count)]}
    if fmt == "snapshot":
        from tidelog.backends.file.format import snapshot as snap

        n, body = snap.decode_snapshot(data)
        return {"n": n, "body": body}
    if fmt == "progress":
        from tidelog.backends.file.format import progress as prg

        p = prg.decode_progress(data)
        return {"hwm": p.hwm, "outcomes": sorted(p.outcomes), "base": p.base,
                "gaps": [[lo, hi] for lo, hi in p.gaps]}
    if fmt == "sf-segment":
        from tidelog.backends.sf import format as sff

        sh = sff.decode_header(data)
        sc = sff.scan_frames(data)
        frames = []
        for off in sc.offsets:
            (n,) = struct.unpack_from("<i", data, off + 4)
            frames.append(_text(data[off + 8 : off + 8 + n]))
        return {"base_seq": sh.base_seq, "created_micros": sh.created_micros, "frames": frames,
                "last_good": sc.last_good, "torn_tail": sc.torn_tail}
    if fmt == "ack-watermark":
        from tidelog.backends.sf import format as sff

        return {"fsn": sff.decode_watermark(data)}
    if fmt == "qseg":
        return _decode_qseg(data)
    if fmt == "blockdev-slot":
        from tidelog.backends.blockdev.format import decode_slot

        slot = decode_slot(data, int(params["index"]))
        return {"generation": slot.generation, "ring_id": slot.ring_id,
                "page_size": slot.page_size, "page_count": slot.page_count,
                "num_pages": slot.num_pages, "looped": slot.looped, "body": slot.body}
    if fmt == "blockdev-page":
        from tidelog.backends.blockdev.format import RecordOut, decode_entries, decode_trailer

        ph = decode_trailer(data, int(params["ring_id"]))
        if ph is None:
            return {"valid": False}
        entries = [
            {"seq": e.seq, "ts": e.ts, "tag": e.tag, "node": e.node,
             "payload": _text(e.payload), "batch_end": e.batch_end}
            if isinstance(e, RecordOut)
            else {"mark": e.pid, "n": e.n, "batch_end": e.batch_end, "carried": e.carried}
            for e in decode_entries(data, ph)
        ]
        return {"valid": True, "first_seq": ph.first_seq, "count": ph.count,
                "page_seq": ph.page_seq, "flags": ph.flags, "entries": entries}
    raise ValueError(f"no decoder for format {fmt!r}")


def _decode_qseg(data: bytes) -> Any:
    from tidelog.backends.file.format.qseg import open_qseg

    r = open_qseg(data)
    bundles: list[Any] = []
    for i in range(len(r)):
        b = r.bundle(i)
        ts, tag, node = r.labels(i)
        if b is None:
            bundles.append(None)
            continue
        bundles.append({
            "ts": ts, "tag": tag, "node": node,
            "slots": {str(slot): {"payload_type": b.payload_type(slot),
                                  "rows": _rows(batch.to_pylist())}
                      for slot, batch in sorted(b.slots.items())},
        })
    return {"first_seq": r.first_seq, "bundles": bundles}


def _rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: (v.hex() if isinstance(v, bytes) else v) for k, v in row.items()} for row in rows]


def decode_error(exc: TidelogError) -> dict[str, Any]:
    return _err(exc.code, getattr(exc, "rule", None))


# =============================================================================================
# file vectors: built from inputs with the encoders
# =============================================================================================
def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x5A]) + data[at + 1 :]


def _wal_vectors(add: Callable[..., None]) -> None:
    from tidelog.backends.file.format import wal

    header = wal.encode_header(1, 0, 1, _T0, _STORE_ID, version=2)  # frames unseeded (WAL-3)
    rows = [  # (seq, ts, tag, node, payload, batch_end)
        (1, _T0 + 123, "t", None, b"hi", True),
        (2, _T0 + 124, None, "n1", b"\x00\x01\x02" * 10, False),
        (3, _T0 + 124, "a", "n2", b"", True),
    ]
    frames = [wal.encode_append(1, q, ts, tag, node, p, batch_end=end, durable=True)
              for q, ts, tag, node, p, end in rows]
    create = wal.encode_control(wal.FrameType.TOPIC_CREATE, 1, {"name": "t", "incarnation": 1,
                                "config": {"durability": "fsync"}}, ts=_T0)
    data = header + create + b"".join(frames)
    offsets = [len(header) + len(create)]
    for f in frames:
        offsets.append(offsets[-1] + len(f))
    hdr = {"gen": 1, "shard": 0, "shard_count": 1, "created_ms": _T0, "store_id": _STORE_ID.hex()}

    def frames_json(n: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = [{
            "type": int(wal.FrameType.TOPIC_CREATE), "flags": wal.BATCH_END, "topic_id": 1,
            "seq": 0, "ts": _T0, "tag": None, "node": None,
            "data": json.dumps({"config": {"durability": "fsync"}, "incarnation": 1,
                                "name": "t"}, separators=(",", ":"), sort_keys=True
                               ).encode().hex(),
            "offset": len(header)}]
        for (q, ts, tag, node, p, end), off in list(zip(rows, offsets))[:n]:
            flags = (wal.HAS_TAG if tag is not None else 0) | (
                wal.HAS_NODE if node is not None else 0) | wal.DURABLE | (
                wal.BATCH_END if end else 0)
            out.append({"type": 1, "flags": flags, "topic_id": 1, "seq": q, "ts": ts, "tag": tag,
                        "node": node, "data": p.hex(), "offset": off})
        return out

    def good(n: int, end: int, status: str) -> dict[str, Any]:
        return {"header": hdr, "frames": frames_json(n), "end": end, "status": status}

    add("wal/valid.log", "wal", True, "header, a TOPIC_CREATE and three APPEND frames (one "
        "two-frame batch)", body=data, decode=good(3, len(data), "clean"))
    add("wal/valid-zero-padded.log", "wal", True, "preallocated zeros after the last frame "
        "(WAL-4 clean end)", body=data + bytes(100),
        decode=good(3, len(data), "clean"))
    add("wal/torn-tail.log", "wal", False, "torn: the last frame cut short (WAL-5)",
        body=data[: offsets[2] + 20], decode=good(2, offsets[2], "torn"))
    add("wal/bad-checksum.log", "wal", False, "bad checksum in the second APPEND's payload",
        body=_flip(data, offsets[1] + 40), decode=good(1, offsets[1], "torn"))
    add("wal/overflowing-length.log", "wal", False, "frame_len of the second APPEND overflows "
        "the file", body=data[: offsets[1]] + struct.pack("<I", 0xFFFFFFF0) + data[offsets[1] + 4:],
        decode=good(1, offsets[1], "torn"))
    add("wal/bad-magic.log", "wal", False, "bad magic in the file header (WAL-1)",
        body=b"XXXXXXXX" + data[8:], error=_err("corrupt", "WAL-1"))
    add("wal/bad-header-crc.log", "wal", False, "header CRC32C mismatch (WAL-1)",
        body=_flip(data, 20), error=_err("corrupt", "WAL-1"))
    add("wal/short-header.log", "wal", False, "torn header: 30 bytes (WAL-1)",
        body=data[:30], error=_err("corrupt", "WAL-1"))
    gap = wal.encode_append(1, 9, rows[2][1], "a", "n2", b"", batch_end=True, durable=True)
    add("wal/seq-gap.log", "wal", True, "a gap: the batch's second APPEND has seq 9 "
        "(checksum-valid; the scanner returns it, verify reports WAL-7)",
        body=data[: offsets[2]] + gap,
        decode={**good(2, offsets[2] + len(gap), "clean"),
                "frames": [*frames_json(2), {**frames_json(3)[3], "seq": 9}]})


def _wal_v3_vectors(add: Callable[..., None]) -> None:
    """Version 3 (WAL-15): the frames of ``_wal_vectors`` in a file of gen 2, checksums seeded
    with 2; FILE_END; a recycled file's older frames (gen 1) after the end."""
    from tidelog.backends.file.format import wal

    header = wal.encode_header(2, 0, 1, _T0, _STORE_ID)
    create = wal.encode_control(wal.FrameType.TOPIC_CREATE, 1, {"name": "t", "incarnation": 1,
                                "config": {"durability": "fsync"}}, ts=_T0, seed=2)
    rec = wal.encode_append(1, 1, _T0 + 123, "t", None, b"hi", batch_end=True, durable=True,
                            seed=2)
    stale = wal.encode_append(1, 7, _T0 + 99, None, None, b"old", batch_end=True, durable=True,
                              seed=1)  # fmt: skip
    end = wal.encode_file_end(2)
    hdr = {"gen": 2, "shard": 0, "shard_count": 1, "created_ms": _T0,
           "store_id": _STORE_ID.hex()}  # fmt: skip
    frames = [
        {"type": int(wal.FrameType.TOPIC_CREATE), "flags": wal.BATCH_END, "topic_id": 1,
         "seq": 0, "ts": _T0, "tag": None, "node": None,
         "data": json.dumps({"config": {"durability": "fsync"}, "incarnation": 1, "name": "t"},
                            separators=(",", ":"), sort_keys=True).encode().hex(),
         "offset": len(header)},
        {"type": 1, "flags": wal.HAS_TAG | wal.DURABLE | wal.BATCH_END, "topic_id": 1,
         "seq": 1, "ts": _T0 + 123, "tag": "t", "node": None, "data": b"hi".hex(),
         "offset": len(header) + len(create)},
    ]  # fmt: skip
    body = header + create + rec
    add("wal/v3-file-end.log", "wal", True, "version 3 (WAL-15): frames checksummed with "
        "XXH3-64 seeded by the gen (2), then FILE_END, then a recycled file's frame of gen 1: "
        "the log ends after FILE_END (frames exclude it)", body=body + end + stale,
        decode={"header": hdr, "frames": frames, "end": len(body + end), "status": "clean"})
    add("wal/v3-stale-tail.log", "wal", True, "version 3, the newest file of a live store: "
        "after the last frame, a complete frame of an older gen (1), which fails the seeded "
        "checksum and ends the log there (WAL-15)", body=body + stale + bytes(64),
        decode={"header": hdr, "frames": frames, "end": len(body), "status": "torn"})
    unseeded = header + wal.reseed(create + rec, 0)
    add("wal/v3-unseeded.log", "wal", False, "version 3 header but frames checksummed without "
        "the seed (as version 2 would): no frame is valid (WAL-3)", body=unseeded,
        decode={"header": hdr, "frames": [], "end": len(header), "status": "torn"})


def _run_segment_vectors(add: Callable[..., None], rows: list[Any]) -> None:
    """The same four records as .data version 2 (run frames) + .idx version 3, what the
    checkpoint writes (spec/FORMATS-seg3.md SEG-14..17), valid and damaged."""
    from tidelog.backends.file.format import segment as seg
    from tidelog.backends.file.format.seal import build_columns

    data, idx = build_columns(7, 5, [r[4] for r in rows], [r[1] for r in rows],
                              [r[2] for r in rows], [r[3] for r in rows])  # fmt: skip
    scan = seg.scan_data(data)
    recs = [{"seq": f.seq, "ts": f.ts, "tag": f.tag, "node": f.node,
             "payload": rows[i][4].hex(), "offset": f.offset}
            for i, f in enumerate(scan.frames)]  # fmt: skip
    dec = {"topic_id": 7, "first_seq": 5, "records": recs, "problem": None}
    add("segment/valid-runs.data", "segment-data", True, "the four records as run frames "
        "(.data version 2, SEG-14..16); offsets are the payloads'", body=data, decode=dec)
    add("segment/valid-runs.idx", "segment-idx", True, "its index (.idx version 3, SEG-17): "
        "entries point at payloads", body=idx,
        decode={"topic_id": 7, "first_seq": 5, "entries": [
            [f.offset, f.length, f.ts, f.flags] for f in scan.frames]})  # fmt: skip
    assert scan.runs is not None and len(scan.runs) >= 3
    slot, frame = scan.runs[2]
    add("segment/bad-checksum-runs.data", "segment-data", False, "a flipped byte in the third "
        "run frame: the whole frame is damaged (SEG-15)", body=_flip(data, frame + 6),
        decode={**dec, "records": recs[:slot], "problem": {"rule": "SEG-15", "offset": frame}})
    add("segment/trailing-runs.data", "segment-data", False, "a byte after the last run frame "
        "(SEG-16)", body=data + b"\x00",
        decode={**dec, "problem": {"rule": "SEG-16", "offset": len(data)}})


def _segment_vectors(add: Callable[..., None]) -> None:
    from tidelog.backends.file.format import segment as seg

    rows = [(5 + i, _T0 + i, ("x" if i % 2 else None), ("n" if i == 2 else None),
             bytes([i]) * (i * 5)) for i in range(4)]
    data, idx = seg.build_segment(7, 5, rows)
    recs: list[dict[str, Any]] = []
    off = seg.HEADER_SIZE
    entries = []
    for q, ts, tag, node, p in rows:
        n = seg.RECORD_OVERHEAD + len(p) + len((tag or "").encode()) + len((node or "").encode())
        flags = (seg.HAS_TAG if tag is not None else 0) | (seg.HAS_NODE if node is not None else 0)
        recs.append({"seq": q, "ts": ts, "tag": tag, "node": node, "payload": p.hex(),
                     "offset": off})
        entries.append([off, n, ts, flags])
        off += n
    dec = {"topic_id": 7, "first_seq": 5, "records": recs, "problem": None}
    add("segment/valid.data", "segment-data", True, "four records from seq 5", body=data,
        decode=dec)
    add("segment/valid.idx", "segment-idx", True, "its index", body=idx,
        decode={"topic_id": 7, "first_seq": 5, "entries": entries})
    third = recs[2]["offset"]
    add("segment/bad-checksum.data", "segment-data", False, "bad checksum in the third record "
        "(SEG-2)", body=_flip(data, third + 30),
        decode={**dec, "records": recs[:2], "problem": {"rule": "SEG-2", "offset": third}})
    add("segment/overflowing-length.data", "segment-data", False, "the third record's frame_len "
        "overflows the file (SEG-2)",
        body=data[:third] + struct.pack("<I", 0x7FFFFFF0) + data[third + 4 :],
        decode={**dec, "records": recs[:2], "problem": {"rule": "SEG-2", "offset": third}})
    add("segment/torn.data", "segment-data", False, "torn: cut inside the last record (SEG-2)",
        body=data[:-5], decode={**dec, "records": recs[:3],
                                "problem": {"rule": "SEG-2", "offset": recs[3]["offset"]}})
    q, ts, tag, node, p = rows[2]
    body = data[:third] + seg.encode_record(q + 3, ts, tag, node, p) + data[recs[3]["offset"] :]
    add("segment/seq-gap.data", "segment-data", False, "a gap: the third record has seq 10 "
        "(SEG-3)", body=body,
        decode={**dec, "records": recs[:2], "problem": {"rule": "SEG-3", "offset": third}})
    add("segment/bad-magic.data", "segment-data", False, "bad magic (SEG-1)",
        body=b"XXXXXXXX" + data[8:], error=_err("corrupt", "SEG-1"))
    add("segment/valid-v1.idx", "segment-idx", True, "the same index in version 1, as an "
        "earlier tidelog wrote it (FORMATS.md §4.3; readers read both)",
        body=seg.index_as_version_1(idx),
        decode={"topic_id": 7, "first_seq": 5, "entries": entries})
    add("segment/bad-footer.idx", "segment-idx", False, "index footer checksum mismatch "
        "(SEG-9: version 2, as SEG-6)", body=_flip(idx, 40), error=_err("corrupt", "SEG-9"))
    add("segment/bad-magic.idx", "segment-idx", False, "bad magic (SEG-4)",
        body=b"XXXXXXXX" + idx[8:], error=_err("corrupt", "SEG-4"))
    add("segment/overflowing-count.idx", "segment-idx", False, "count larger than the file "
        "(SEG-9: version 2, as SEG-6)", body=idx[:12] + struct.pack("<I", 1000) + idx[16:],
        error=_err("corrupt", "SEG-9"))
    _run_segment_vectors(add, rows)
    v1 = seg.index_as_version_1(idx)
    add("segment/overflowing-count-v1.idx", "segment-idx", False, "version 1: count larger "
        "than the file (SEG-6)", body=v1[:12] + struct.pack("<I", 1000) + v1[16:],
        error=_err("corrupt", "SEG-6"))


def _snapshot_vectors(add: Callable[..., None]) -> None:
    from tidelog.backends.file.format import snapshot as snap

    body = {"version": 1, "store_id": _STORE_ID.hex(), "note": "golden"}
    data = snap.encode_snapshot(3, body)
    add("snapshot/valid.bin", "snapshot", True, "snapshot 3", body=data,
        decode={"n": 3, "body": body})
    add("snapshot/bad-checksum.bin", "snapshot", False, "checksum mismatch (SNAP-2)",
        body=_flip(data, 40), error=_err("corrupt", "SNAP-2"))
    add("snapshot/bad-magic.bin", "snapshot", False, "bad magic (SNAP-1)",
        body=b"XXXXXXXX" + data[8:], error=_err("corrupt", "SNAP-1"))
    add("snapshot/torn.bin", "snapshot", False, "torn: cut inside the body (SNAP-2)",
        body=data[:-12], error=_err("corrupt", "SNAP-2"))
    add("snapshot/overflowing-length.bin", "snapshot", False, "body_len larger than the file "
        "(SNAP-2)", body=data[:24] + struct.pack("<Q", 1 << 40) + data[32:],
        error=_err("corrupt", "SNAP-2"))


def _progress_vectors(add: Callable[..., None]) -> None:
    from tidelog.backends.file.format import progress as prg

    data = prg.encode_progress(5, [7, 9, 4100], 2, [(6, 6)])
    add("progress/valid.quiver.sub", "progress", True, "hwm 5, outcomes 7, 9, 4100 (two "
        "blocks), base 2, gap 6..6", body=data,
        decode={"hwm": 5, "outcomes": [7, 9, 4100], "base": 2, "gaps": [[6, 6]]})
    gaps = prg.encode_progress(5, [7, 9, 4100], 2, [(6, 6), (8, 8), (10, 4099)])
    add("progress/three-gaps.quiver.sub", "progress", True, "version 2: hwm 5, outcomes 7, 9, "
        "4100, base 2, gaps 6..6, 8..8, 10..4099 (PRG-10)", body=gaps,
        decode={"hwm": 5, "outcomes": [7, 9, 4100], "base": 2,
                "gaps": [[6, 6], [8, 8], [10, 4099]]})
    bad = gaps[:56] + struct.pack("<Q", 3) + gaps[64:-4]
    bad += struct.pack("<I", _crc32c(bad))
    add("progress/gap-count-overflow.quiver.sub", "progress", False, "version 2 whose more_gaps "
        "needs more header than header_size gives, CRC valid (PRG-10)", body=bad,
        error=_err("corrupt", "PRG-10"))
    add("progress/bad-crc.quiver.sub", "progress", False, "CRC32C mismatch (PRG-1)",
        body=_flip(data, 60), error=_err("corrupt", "PRG-1"))
    add("progress/bad-magic.quiver.sub", "progress", False, "bad magic (PRG-1)",
        body=b"XXXXXXXX" + data[8:], error=_err("corrupt", "PRG-1"))
    add("progress/torn.quiver.sub", "progress", False, "torn: 30 bytes (PRG-1)",
        body=data[:30], error=_err("corrupt", "PRG-1"))
    bad = data[:22] + struct.pack("<I", 9) + data[26:-4]
    bad += struct.pack("<I", _crc32c(bad))
    add("progress/overflowing-count.quiver.sub", "progress", False, "entry_count larger than "
        "the file, CRC valid (PRG-3)", body=bad, error=_err("corrupt", "PRG-3"))


def _crc32c(data: bytes) -> int:
    from tidelog.backends.sf.format import crc32c

    return crc32c(data)


def _sf_vectors(add: Callable[..., None]) -> None:
    from tidelog.backends.sf import format as sff

    payloads = [b"hello", b"", b"x" * 50, b"last"]
    head = sff.encode_header(40, 1_700_000_000_000_000)
    frames = [sff.encode_frame(p) for p in payloads]
    data = head + b"".join(frames)
    offs = [sff.HEADER_SIZE]
    for f in frames:
        offs.append(offs[-1] + len(f))

    def dec(n: int, body: bytes, last_good: int) -> dict[str, Any]:
        # SF-7: the torn-tail count is the non-zero bytes among the 8 after the last good frame
        window = body[last_good : last_good + sff.FRAME_HEADER_SIZE]
        return {"base_seq": 40, "created_micros": 1_700_000_000_000_000,
                "frames": [p.hex() for p in payloads[:n]], "last_good": last_good,
                "torn_tail": sum(1 for b in window if b)}

    def add_sf(path: str, what: str, body: bytes, n: int, last_good: int) -> None:
        add(path, "sf-segment", n == len(payloads), what, body=body,
            decode=dec(n, body, last_good))

    add_sf("sf/valid.sfa", "four frames from FSN 40, zero-filled tail", data + bytes(64), 4,
           len(data))
    add_sf("sf/torn-tail.sfa", "torn: the last frame cut short (SF-7)",
           data[:-2] + bytes(64), 3, offs[3])
    add_sf("sf/bad-checksum.sfa", "CRC32C mismatch in the third frame",
           _flip(data, offs[2] + 20), 2, offs[2])
    add_sf("sf/overflowing-length.sfa", "payloadLen of the second frame overflows the file",
           data[: offs[1] + 4] + struct.pack("<i", 1 << 30) + data[offs[1] + 8 :], 1, offs[1])
    add_sf("sf/negative-length.sfa", "negative payloadLen in the second frame",
           data[: offs[1] + 4] + struct.pack("<i", -5) + data[offs[1] + 8 :], 1, offs[1])
    add("sf/bad-magic.sfa", "sf-segment", False, "bad magic (SF-3, recovery refuses: SF-8)",
        body=b"XXXX" + data[4:], error=_err("corrupt"))
    add("sf/bad-version.sfa", "sf-segment", False, "version 2 (SF-3)",
        body=data[:4] + b"\x02" + data[5:], error=_err("corrupt"))
    add("sf/negative-base.sfa", "sf-segment", False, "negative baseSeq (SF-3)",
        body=data[:8] + struct.pack("<q", -1) + data[16:], error=_err("corrupt"))
    add("sf/short.sfa", "sf-segment", False, "torn header: 10 bytes (SF-8)",
        body=data[:10], error=_err("corrupt"))
    wm = sff.encode_watermark(42)
    add("sf/valid.ack-watermark", "ack-watermark", True, "watermark 42", body=wm,
        decode={"fsn": 42})
    add("sf/bad-magic.ack-watermark", "ack-watermark", False, "bad magic: unusable (SF-6)",
        body=b"XXXX" + wm[4:], decode={"fsn": None})
    add("sf/torn.ack-watermark", "ack-watermark", False, "torn: 9 bytes: unusable (SF-6)",
        body=wm[:9], decode={"fsn": None})
    add("sf/negative.ack-watermark", "ack-watermark", False, "negative FSN: unusable (SF-6)",
        body=sff.encode_watermark(-3), decode={"fsn": None})


def _qseg_vectors(add: Callable[..., None]) -> None:
    import pyarrow as pa

    from tidelog.backends.file.format.qseg import build_qseg
    from tidelog.bundle import RecordBundle

    b0 = RecordBundle({0: pa.record_batch({"v": pa.array([1, 2], pa.int32())}),
                       1: pa.record_batch({"k": pa.array(["a", "b"])})})
    b1 = RecordBundle({0: pa.record_batch({"v": pa.array([3], pa.int32())})},
                      payload_types={0: 9})
    data = build_qseg([b0, None, b1], 7, tss=[1000, None, 1002], tags=["t", None, None],
                      nodes=[None, None, "n"])
    dec = {"first_seq": 7, "bundles": [
        {"ts": 1000, "tag": "t", "node": None, "slots": {
            "0": {"payload_type": 0, "rows": [{"v": 1}, {"v": 2}]},
            "1": {"payload_type": 1, "rows": [{"k": "a"}, {"k": "b"}]}}},
        None,
        {"ts": 1002, "tag": None, "node": "n", "slots": {
            "0": {"payload_type": 9, "rows": [{"v": 3}]}}},
    ]}
    ok = _verify(True)
    add("qseg/valid.qseg", "qseg", True, "bundles for seqs 7..9 (8 has no record)", body=data,
        decode=dec, verify=ok)
    add("qseg/truncated.qseg", "qseg", False, "torn: 10 bytes (QSEG-7 Truncated)",
        body=data[:10], error=_err("corrupt", "QSEG-7"), verify=_verify(False, ("QSEG-7",)))
    add("qseg/bad-magic.qseg", "qseg", False, "bad trailer magic (QSEG-7)",
        body=data[:-12] + b"XXXXXXXX" + data[-4:], error=_err("corrupt", "QSEG-7"),
        verify=_verify(False, ("QSEG-7",)))
    add("qseg/bad-checksum.qseg", "qseg", False, "CRC32 of the file mismatches (QSEG-7)",
        body=_flip(data, 100), error=_err("corrupt", "QSEG-7"), verify=_verify(False, ("QSEG-7",)))
    foot_size = struct.unpack_from("<I", data, len(data) - 16)[0]
    foot_at = len(data) - 16 - foot_size
    bad = data[:foot_at] + struct.pack("<H", 2) + data[foot_at + 2 : -4]
    bad += struct.pack("<I", zlib.crc32(bad))
    add("qseg/bad-version.qseg", "qseg", False, "footer version 2, CRC valid (QSEG-8)", body=bad,
        error=_err("corrupt", "QSEG-8"), verify=_verify(False, ("QSEG-8",)))
    bad = data[:-16] + struct.pack("<I", len(data)) + data[-12:-4]
    bad += struct.pack("<I", zlib.crc32(bad))
    add("qseg/overflowing-footer.qseg", "qseg", False, "footer_size larger than the file, CRC "
        "valid (QSEG-8)", body=bad, error=_err("corrupt", "QSEG-8"),
        verify=_verify(False, ("QSEG-8",)))


def _blockdev_file_vectors(add: Callable[..., None]) -> None:
    from tidelog.backends.blockdev import format as bf

    ring_id = 0x1122334455667788
    slot = bf.Slot(3, ring_id, 512, 8, 2, True, {"topic": "ring", "v": 1})
    raw = bf.encode_slot(slot)
    dec = {"generation": 3, "ring_id": ring_id, "page_size": 512, "page_count": 8,
           "num_pages": 2, "looped": True, "body": {"topic": "ring", "v": 1}}
    add("blockdev/valid.slot", "blockdev-slot", True, "metadata slot, generation 3 (slot 0)",
        body=raw, params={"index": 0}, decode=dec)
    add("blockdev/bad-checksum.slot", "blockdev-slot", False, "CRC32C mismatch (BDEV-3)",
        body=_flip(raw, 100), params={"index": 0}, error=_err("corrupt", "BDEV-3"))
    add("blockdev/bad-magic.slot", "blockdev-slot", False, "bad magic (BDEV-3)",
        body=b"XXXXXXXX" + raw[8:], params={"index": 0}, error=_err("corrupt", "BDEV-3"))
    add("blockdev/wrong-index.slot", "blockdev-slot", False, "generation 3 read as slot 1 "
        "(BDEV-4)", body=raw, params={"index": 1}, error=_err("corrupt", "BDEV-4"))
    body = bf.encode_record(_T0, b"t", None, b"hello", batch_end=False)
    body += bf.encode_record(5, None, b"n", b"", batch_end=True)
    h = bf.PageHeader(11, 1, 0, 3, 2, len(body), 3, bf.PAGE_PARTIAL, 2)
    page = bf.encode_page(512, ring_id, body, h)
    pdec = {"valid": True, "first_seq": 11, "count": 2, "page_seq": 3, "flags": bf.PAGE_PARTIAL,
            "entries": [
                {"seq": 11, "ts": _T0, "tag": "t", "node": None, "payload": b"hello".hex(),
                 "batch_end": False},
                {"seq": 12, "ts": _T0 + 5, "tag": None, "node": "n", "payload": "",
                 "batch_end": True}]}
    add("blockdev/valid.page", "blockdev-page", True, "a page holding seqs 11 and 12",
        body=page, params={"ring_id": ring_id}, decode=pdec)
    add("blockdev/bad-checksum.page", "blockdev-page", False, "torn or damaged: CRC32C "
        "mismatch: not a valid page (BDEV-7)", body=_flip(page, 3),
        params={"ring_id": ring_id}, decode={"valid": False})
    add("blockdev/other-ring.page", "blockdev-page", False, "a page of another format (ring id "
        "differs: RING-5)", body=page, params={"ring_id": ring_id + 1}, decode={"valid": False})
    t = 512 - bf.TRAILER_BYTES
    over = page[:t] + page[t : t + 40] + struct.pack("<I", 10_000) + page[t + 44 :]
    add("blockdev/overflowing-used.page", "blockdev-page", False, "used larger than the page: "
        "not valid (BDEV-7)", body=over, params={"ring_id": ring_id}, decode={"valid": False})


# =============================================================================================
# container vectors: written by the backends, then damaged
# =============================================================================================
def store_content(store: Any) -> dict[str, Any]:
    """What a reader recovers: every topic's items and subscriber hwms (JSON)."""
    out: dict[str, Any] = {}
    for name in store.topics():
        t = store.topic(name, create=False)
        items = []
        for i in t.read(0, 10**9):
            if isinstance(i, tidelog.Tombstone):
                items.append({"tombstone": [i.gap_from, i.gap_to]})
            else:
                items.append({"seq": i.seq, "ts": i.ts, "tag": i.tag, "node": i.node,
                              "payload": i.payload.hex()})
        subs = {s: t.subscriber(s).hwm for s in t.subscribers()}
        out[name] = {"items": items, "subscribers": subs}
    return out


FILE_OPTIONS = ("background=false&prealloc=none&wal_file_bytes=64KiB&checkpoint_bytes=4KiB"
                "&segment_max_records=4")


def _write_file_store(root: str) -> dict[str, Any]:
    clock = FakeClock(_T0)
    store = tidelog.open(f"file://{root}?{FILE_OPTIONS}", clock=clock)
    events = store.topic("events", durability="fsync", trim="none")
    sub = events.subscribe("reader", start="earliest")
    expected = []
    for i in range(10):
        clock.advance(3)
        tag, node = ("t" if i % 3 else None), ("n" if i % 4 == 0 else None)
        payload = bytes([65 + i]) * (i * 11 % 40)
        seq = events.append(payload, tag=tag, node=node)
        expected.append({"seq": seq, "ts": clock.now_ms(), "tag": tag, "node": node,
                         "payload": payload.hex()})
    events.append_many([b"batch-1", b"batch-2", b"batch-3"])  # one APPEND_BATCH frame
    for j in range(3):
        expected.append({"seq": 11 + j, "ts": clock.now_ms(), "tag": None, "node": None,
                         "payload": f"batch-{j + 1}".encode().hex()})
    # two runs with different labels: one op of two frames (the wal-seq-gap vector cuts it)
    rows = [(b"run-1", "r1", None), (b"run-2", "r2", "n")]
    events.append_records(rows)
    for j, (p, tag, node) in enumerate(rows):
        expected.append({"seq": 14 + j, "ts": clock.now_ms(), "tag": tag, "node": node,
                         "payload": p.hex()})
    sub.commit(4)
    sub.ack(6)
    sub.flush()
    hooks(store, Checkpoint).checkpoint()  # seals segments, writes a snapshot
    jobs = store.topic("jobs", durability="disk")
    jobs.append(b"job")
    store.flush()
    content = store_content(store)
    assert content["events"]["items"] == expected, "the writer does not read back what it wrote"
    store.close()
    return content


def _file_store_vectors(out: str, add_dir: Callable[..., None]) -> None:
    from tidelog.backends.file.format import wal

    base = os.path.join(out, "file-store", "valid")
    content = _write_file_store(base)
    add_dir("file-store/valid", "file-store", True, "two topics: WAL, sealed segments, a "
            "snapshot, a progress file", verify=_verify(True), content=content)

    def variant(
        name: str, what: str, change: Callable[[str], None], verify: dict[str, Any]
    ) -> None:
        path = os.path.join(out, "file-store", name)
        shutil.copytree(base, path)
        change(path)
        add_dir(f"file-store/{name}", "file-store", False, what, verify=verify)

    def newest_wal(root: str) -> str:
        d = os.path.join(root, "wal")
        return os.path.join(d, max(n for n in os.listdir(d) if n.endswith(".log")))

    def first(root: str, suffix: str) -> str:
        for dirpath, _, names in sorted(os.walk(root)):
            for n in sorted(names):
                if n.endswith(suffix):
                    return os.path.join(dirpath, n)
        raise FileNotFoundError(suffix)

    def rewrite(path: str, fn: Callable[[bytes], bytes]) -> None:
        with open(path, "rb") as f:
            data = f.read()
        with open(path, "wb") as f:
            f.write(fn(data))

    def last_frame(data: bytes) -> wal.Frame:
        return wal.scan_file(data).frames[-1]

    variant("wal-torn-tail", "torn: the newest WAL file's last frame cut short (WAL-5; "
            "version 3, WAL-15: recovery closes the log there with FILE_END; in the newest "
            "file a torn frame cannot be told from a recycled file's stale one, so verify "
            "reports nothing)",
            lambda r: rewrite(newest_wal(r), lambda d: d[: last_frame(d).offset + 10]),
            _verify(True, (), ()))
    variant("wal-bad-magic", "bad magic in the newest WAL file's header (WAL-1)",
            lambda r: rewrite(newest_wal(r), lambda d: b"XXXXXXXX" + d[8:]),
            _verify(False, ("WAL-1",)))
    variant("segment-bad-checksum", "bad checksum inside a sealed segment's first run frame "
            "(SEG-15: corruption of acknowledged records)",
            lambda r: rewrite(first(r, ".data"), lambda d: _flip(d, 32 + 30)),
            _verify(False, ("SEG-15",)))
    variant("segment-lone-data", "a sealed .data without its .idx (SEG-7)",
            lambda r: os.unlink(first(r, ".idx")), _verify(False, ("SEG-7",)))
    variant("segment-bad-index", "a sealed segment's .idx with a bad footer "
            "(SEG-17: version 3, as SEG-9)",
            lambda r: rewrite(first(r, ".idx"), lambda d: _flip(d, 36)),
            _verify(False, ("SEG-17",)))
    variant("progress-bad-crc", "a subscriber progress file with a bad CRC32C (PRG-1)",
            lambda r: rewrite(first(r, "quiver.sub.reader"), lambda d: _flip(d, 40)),
            _verify(False, ("PRG-1",)))
    variant("snapshot-copy-bad-checksum", "one copy of the only snapshot damaged: the mirror "
            "serves (SNAP-2, SNAP-5)",
            lambda r: rewrite(first(r, ".bin"), lambda d: _flip(d, 40)),
            _verify(True, (), ("SNAP-5",)))

    def both_copies(r: str) -> None:
        rewrite(first(r, ".bin"), lambda d: _flip(d, 40))
        rewrite(first(r, ".mirror"), lambda d: _flip(d, 40))

    variant("snapshot-bad-checksum", "both copies of the only snapshot damaged (SNAP-2; none "
            "valid: SNAP-4)", both_copies, _verify(False, ("SNAP-2",)))

    def gap(r: str) -> None:
        appends = (wal.FrameType.APPEND, wal.FrameType.APPEND_BATCH)

        def pair(a: wal.Frame, b: wal.Frame) -> bool:
            return a.type in appends and b.type in appends and not a.batch_end and (
                a.topic_id == b.topic_id
            )

        def fn(d: bytes) -> bytes:
            seed = wal.frame_seed(wal.decode_header(d))
            for a, b in pairwise(wal.scan_file(d).frames):
                if pair(a, b):
                    fixed: bytes | bytearray
                    if b.type == wal.FrameType.APPEND:
                        fixed = wal.encode_append(b.topic_id, b.seq + 5, b.ts, b.tag, b.node,
                                                  b.data, batch_end=b.batch_end,
                                                  durable=b.durable, seed=seed)
                    else:
                        payloads = wal.split_append_batch(b.data, "vector")
                        fixed = wal.encode_append_batch(b.topic_id, b.seq + 5, b.ts, b.tag,
                                                        b.node, payloads,
                                                        batch_end=b.batch_end,
                                                        durable=b.durable, seed=seed)
                    return d[: b.offset] + fixed + d[b.offset + b.length :]
            raise AssertionError("no multi-frame batch in the WAL")
        for n in sorted(os.listdir(os.path.join(r, "wal"))):
            if wal.parse_file_name(n) is None:
                continue  # a spare (WAL-15) is never read
            path = os.path.join(r, "wal", n)
            with open(path, "rb") as f:
                frames = wal.scan_file(f.read()).frames
            if any(pair(a, b) for a, b in pairwise(frames)):
                rewrite(path, fn)
                return
        raise AssertionError("no multi-frame batch in any WAL file")

    variant("wal-seq-gap", "a gap: an append frame inside an op skips 5 seqs, checksum valid "
            "(WAL-7)", gap, _verify(False, ("WAL-7",)))


def _sf_slot_vectors(out: str, add_dir: Callable[..., None]) -> None:
    from tidelog.backends.sf import format as sff
    from tidelog.backends.sf.slot import Slot

    sf_dir = os.path.join(out, "sf-slot")
    base = os.path.join(sf_dir, "valid")
    # Slot format 1 (FORWARD.md SF-23): the variants below edit its 16-byte watermark.
    slot = Slot.open(sf_dir, "valid", fs=OsFS(), max_bytes=96, max_total_bytes=1 << 20,
                     durability="append", clock=FakeClock(_T0), slot_format=1)
    payloads = [f"frame-{i}".encode() * (1 + i % 3) for i in range(12)]
    for p in payloads:
        slot.append(p)
    slot.acknowledge(3)
    slot.apply_acks()
    slot.close()
    for name in (".lock", ".lock.pid"):
        os.unlink(os.path.join(base, name))
    content = _slot_content(base)
    assert content["published_fsn"] == 11 and content["acked_fsn"] == 3, content
    assert all(content["frames"][str(q)] == payloads[q].hex() for q in range(4, 12)), content
    add_dir("sf-slot/valid", "sf-slot", True, "12 frames in several segments, acked through "
            "FSN 3 (trimmed below), with a watermark", verify=_verify(True), content=content)
    segs = sorted(n for n in os.listdir(base) if sff.is_segment_name(n))

    def variant(
        name: str, what: str, change: Callable[[str], None], verify: dict[str, Any]
    ) -> None:
        path = os.path.join(sf_dir, name)
        shutil.copytree(base, path)
        change(path)
        add_dir(f"sf-slot/{name}", "sf-slot", False, what, verify=verify)

    def rewrite(path: str, fn: Callable[[bytes], bytes]) -> None:
        with open(path, "rb") as f:
            data = f.read()
        with open(path, "wb") as f:
            f.write(fn(data))

    def torn(d: bytes) -> bytes:
        end = sff.scan_frames(d).last_good
        return d[:end] + b"\x07\x00\x00\x00\xff\xff" + d[end + 6 :]

    variant("torn-tail", "torn: garbage after the active segment's last frame (SF-7)",
            lambda r: rewrite(os.path.join(r, segs[-1]), torn), _verify(True, (), ("SF-7",)))
    variant("bad-checksum-sealed", "bad CRC in a sealed segment's first frame: a gap opens, the "
            "next segment's baseSeq proves the frames were written: damage (SF-18)",
            lambda r: rewrite(os.path.join(r, segs[0]), lambda d: _flip(d, 24 + 10)),
            _verify(False, ("SF-18",)))
    variant("bad-checksum-active", "bad CRC in the active segment's first frame: the sync record "
            "proves it durable: damage, never a torn tail (SF-18)",
            lambda r: rewrite(os.path.join(r, segs[-1]), lambda d: _flip(d, 24 + 10)),
            _verify(False, ("SF-18",)))
    variant("bad-magic", "bad magic in a segment header (SF-3)",
            lambda r: rewrite(os.path.join(r, segs[0]), lambda d: b"XXXX" + d[4:]),
            _verify(False, ("SF-3",)))
    variant("negative-base", "negative baseSeq (SF-3)",
            lambda r: rewrite(os.path.join(r, segs[-1]),
                              lambda d: d[:8] + struct.pack("<q", -2) + d[16:]),
            _verify(False, ("SF-3",)))
    variant("overflowing-length", "payloadLen of the active segment's first frame overflows "
            "the file: the sync record proves the frame durable: damage (SF-18)",
            lambda r: rewrite(os.path.join(r, segs[-1]),
                              lambda d: d[:28] + struct.pack("<i", 1 << 30) + d[32:]),
            _verify(False, ("SF-18",)))
    def unsynced_overflow(r: str) -> None:
        rewrite(os.path.join(r, segs[-1]), lambda d: d[:28] + struct.pack("<i", 1 << 30) + d[32:])
        os.unlink(os.path.join(r, ".tidelog-sync"))

    variant("overflowing-length-unsynced", "payloadLen of the active segment's first frame "
            "overflows the file, no sync record: a torn tail (SF-7)", unsynced_overflow,
            _verify(True, (), ("SF-7",)))
    variant("sync-record-damaged", "both copies of the sync record damaged (SF-17, SF-18)",
            lambda r: rewrite(os.path.join(r, ".tidelog-sync"),
                              lambda d: _flip(_flip(d, 40), 4096 + 40)),
            _verify(False, ("SF-18",)))
    if len(segs) >= 3:
        variant("gap", "a gap: a middle segment deleted (SF-10)",
                lambda r: os.unlink(os.path.join(r, segs[1])), _verify(False, ("SF-10",)))
    variant("watermark-garbage", "garbage watermark: unusable, recovery replays (SF-6)",
            lambda r: rewrite(os.path.join(r, ".ack-watermark"), lambda d: b"\xff" * 16),
            _verify(True, (), ("SF-6",)))
    variant("watermark-above-published", "watermark above publishedFsn: ignored (SF-10); it "
            "differs from its check, the smaller is trusted (SF-17)",
            lambda r: rewrite(os.path.join(r, ".ack-watermark"),
                              lambda d: sff.encode_watermark(500)),
            _verify(True, (), ("SF-10", "SF-17")))
    variant("unborn-segment", "an all-zero segment file: deleted at open (SF-8)",
            lambda r: _write(os.path.join(r, "sf-00000000000000ff.sfa"), bytes(96)),
            _verify(True, (), ("SF-8",)))


def _write(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def _slot_content(path: str) -> dict[str, Any]:
    """What recovery makes of a slot: the FSN seed and every frame on disk."""
    from tidelog.backends.sf.recovery import recover

    rec = recover(OsFS(), path)
    frames: dict[str, str] = {}
    for seg in rec.segments:
        with open(os.path.join(path, seg.name), "rb") as f:
            data = f.read()
        for k, off in enumerate(seg.offsets):
            (n,) = struct.unpack_from("<i", data, off + 4)
            frames[str(seg.base_seq + k)] = data[off + 8 : off + 8 + n].hex()
    return {"acked_fsn": rec.acked_fsn, "published_fsn": rec.published_fsn, "frames": frames}


def _blockdev_image_vectors(out: str, add_dir: Callable[..., None]) -> None:
    from tidelog.backends.blockdev import format as bf
    from tidelog.backends.blockdev.device import Geometry
    from tidelog.backends.blockdev.ring import page_reader, scan_ring

    pages, page_size = 8, 512
    size = bf.META_BYTES + pages * page_size
    base = os.path.join(out, "blockdev-image", "valid.img")
    os.makedirs(os.path.dirname(base), exist_ok=True)
    clock = FakeClock(_T0)
    store = tidelog.open(f"blockdev://{base}?size={size}&page_size={page_size}&topic=ring",
                         clock=clock)
    t = store.topic("ring", durability="fsync")
    for i in range(19):  # one page each: two laps and a bit
        clock.advance(1)
        t.append(f"record-{i}".encode() * (1 + i % 4), tag="k" if i % 2 else None)
    content = store_content(store)
    store.close()
    add_dir("blockdev-image/valid.img", "blockdev-image", True, "a ring of 8 pages of 512 bytes "
            "in its third lap (19 fsync appends)", verify=_verify(True), content=content)

    crashed = os.path.join(out, "blockdev-image", "crashed.img")
    store = tidelog.open(f"blockdev://{crashed}?size={size}&page_size={page_size}&topic=ring",
                         clock=clock)
    t = store.topic("ring", durability="fsync")
    for i in range(11):
        clock.advance(1)
        t.append(f"crash-{i}".encode() * (1 + i % 3))
    content = store_content(store)
    hooks(store, Abandon).abandon()  # killed: the metadata slot is older than the pages
    add_dir("blockdev-image/crashed.img", "blockdev-image", True, "a ring left by a killed "
            "writer in its second lap: the metadata predates the pages (BDEV-14, BDEV-17)",
            verify=_verify(True), content=content)

    with open(crashed, "rb") as f:
        image = f.read()
    slot = max((bf.decode_slot(image[i * bf.SLOT_BYTES : (i + 1) * bf.SLOT_BYTES], i)
                for i in (0, 1) if _valid_slot(image, i)), key=lambda s: s.generation)
    geom = Geometry(slot.page_size, slot.page_count)
    scan = scan_ring(page_reader(lambda n, off: image[off : off + n], geom), geom, slot.ring_id)
    assert scan.head is not None
    head_at = geom.offset(scan.head.index)

    def variant(name: str, what: str, data: bytes, verify: dict[str, Any]) -> None:
        path = os.path.join(out, "blockdev-image", name)
        with open(path, "wb") as f:
            f.write(data)
        add_dir(f"blockdev-image/{name}", "blockdev-image", False, what, verify=verify)

    variant("torn-head-page.img", "torn: a killed writer's last page (the head) damaged, with "
            "nothing written after it: recovery ends the ring one page earlier (RING-4) and "
            "warns that it may be damage no later write proves (BDEV-22)",
            _flip(image, head_at + 20), _verify(True, (), ("BDEV-22",)))
    newest = bf.slot_index(slot.generation) * bf.SLOT_BYTES
    variant("damaged-slot.img", "the newest metadata slot damaged, and a page written after "
            "it names its generation: damage, refused (BDEV-22 (d); `tidelog repair` rebuilds "
            "it, BDEV-26)",
            _flip(image, newest + 60), _verify(False, ("BDEV-22",), ("BDEV-22",)))
    variant("no-slot.img", "both metadata slots damaged: not a ring (BDEV-3, BDEV-11)",
            _flip(_flip(image, 60), bf.SLOT_BYTES + 60), _verify(False, ("BDEV-3", "BDEV-11")))
    h0 = bf.decode_trailer(image[geom.offset(0) : geom.offset(0) + page_size], slot.ring_id)
    assert h0 is not None
    page0 = image[geom.offset(0) : geom.offset(0) + page_size]
    bogus = bf.PageHeader(h0.first_seq, h0.floor, h0.min_hwm, h0.meta_gen, h0.count, h0.used,
                          pages // 2, h0.flags, h0.lap)
    rewritten = bf.encode_page(page_size, slot.ring_id, page0[: h0.used], bogus)
    variant("bad-page-number.img", f"page 0 numbered {pages // 2}, of neither lap's formula "
            "(RING-1): not a ring this scheme writes (RING-4)",
            image[: geom.offset(0)] + rewritten + image[geom.offset(1) :],
            _verify(False, ("RING-4",)))


def _valid_slot(image: bytes, i: int) -> bool:
    from tidelog.backends.blockdev import format as bf

    try:
        bf.decode_slot(image[i * bf.SLOT_BYTES : (i + 1) * bf.SLOT_BYTES], i)
    except TidelogError:
        return False
    return True


# =============================================================================================
def write_vectors(out_dir: str) -> dict[str, Any]:
    """Write every vector under ``out_dir`` (created; must not hold an earlier set) and
    ``manifest.json``; returns the manifest."""
    if os.path.exists(os.path.join(out_dir, "manifest.json")):
        raise FileExistsError(f"{out_dir} already holds vectors; use an empty directory")
    os.makedirs(out_dir, exist_ok=True)
    vectors: list[Vector] = []

    def add(path: str, fmt: str, valid: bool, what: str, *, body: bytes, decode: Any = None,
            error: dict[str, Any] | None = None, params: dict[str, Any] | None = None,
            verify: dict[str, Any] | None = None) -> None:
        full = os.path.join(out_dir, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as f:
            f.write(body)
        vectors.append(Vector(path, fmt, valid, what, decode=decode, error=error,
                              params=params or {}, verify=verify))

    def add_dir(path: str, fmt: str, valid: bool, what: str, *, verify: dict[str, Any],
                content: Any = None) -> None:
        vectors.append(Vector(path, fmt, valid, what, verify=verify, content=content))

    for build in (_wal_vectors, _wal_v3_vectors, _segment_vectors, _snapshot_vectors,
                  _progress_vectors, _sf_vectors, _qseg_vectors, _blockdev_file_vectors):
        build(add)
    _file_store_vectors(out_dir, add_dir)
    _sf_slot_vectors(out_dir, add_dir)
    _blockdev_image_vectors(out_dir, add_dir)
    manifest = {
        "generator": f"tidelog {tidelog.__version__}",
        "formats": list(FORMATS),
        "vectors": [v.to_json() for v in vectors],
    }
    with open(os.path.join(out_dir, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
    return manifest

