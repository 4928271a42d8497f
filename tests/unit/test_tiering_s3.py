"""The cold tier on an S3-compatible endpoint (spec/TIERING.md TIER-1, TIER-2, TIER-11): moto's
threaded server on 127.0.0.1, started and stopped by the test (tests/conftest.py ``s3_url``),
behind pyarrow's S3 filesystem."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import tidelog
from tidelog.backends.file import coldread
from tidelog.hooks import Checkpoint, hooks
from tidelog.records import Record


def test_TIER_2_TIER_11_a_cold_tier_on_an_s3_endpoint(tmp_path: Path, s3_url: str) -> None:
    """TIER-1, TIER-2, TIER-5, TIER-11: a store relocates to an S3 bucket (the URL given
    percent-encoded in the store URI), reads every record back through it after a reopen,
    and the cold-only reader reads the history from the bucket alone."""
    uri = f"file://{tmp_path}/s?cold={quote(s3_url, safe='')}&segment_max_records=10"
    s = tidelog.open(uri, background=False, hot_retain_segments=1)
    t = s.topic("t")
    for lo in range(0, 45, 5):
        t.append_many([b"p%05d" % i for i in range(lo, lo + 5)])
    hooks(s, Checkpoint).checkpoint()
    kinds = [type(c).__name__ for c in s._backend.topics["t"].log.chunks]  # type: ignore[attr-defined]
    assert kinds == ["ColdChunk"] * 4 + ["SegChunk"]
    want = [b"p%05d" % i for i in range(45)]
    s.close()
    r = tidelog.open(uri, background=False)
    got = [i.payload for i in r.topic("t").read(after=0, limit=100) if isinstance(i, Record)]
    assert got == want
    r.close()
    with coldread.open_cold(s3_url) as view:
        assert view.head("t") == 40
        cold = [i.payload for i in view.read("t", after=0, limit=100) if isinstance(i, Record)]
        assert cold == want[:40]
