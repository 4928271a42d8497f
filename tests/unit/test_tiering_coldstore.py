"""A cold tier opened as a read-only store, ``tidelog.open("cold+URL")`` (spec/TIERING.md
TIER-12), and secrets in cold URLs (TIER-13): a local directory and moto's S3 server."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from urllib.parse import quote

import pytest
from click.testing import CliRunner
from test_tiering import _fill, _open, _tick

import tidelog
from tidelog.backends.file import coldread
from tidelog.cli import main
from tidelog.errors import BadOption, NotAvailable, ReadOnly
from tidelog.records import Record, Tombstone
from tidelog.uri import redact_text, redact_url


def _history(tmp_path: Path) -> tuple[Path, Path]:
    """Seqs 1..45 of topic ``t``, 1..5 evicted (floor 6), 6..13 deleted, 11..40 cold (the
    TIER-9 test's store), the hot directory removed: (root, cold)."""
    root, cold = tmp_path / "s", tmp_path / "cold"
    s = _open(root, cold, hot_retain_segments=1)
    t = _fill(s, 40, cap_records=40)
    _tick(s)
    t.append_many([b"x"] * 5)
    t.delete(before_seq=14)
    _tick(s)
    s.close()
    return root, cold


def test_TIER_12_a_cold_tier_opens_as_a_read_only_store(tmp_path: Path) -> None:
    """TIER-12: cold+file:// opens without the hot store: topics, reads with the tombstone
    and deleted seqs silent (as open_cold), state; writes are read_only, deletes and
    subscribers not_available; unknown keywords and readonly=false are bad_option."""
    root, cold = _history(tmp_path)
    shutil.rmtree(root)
    with coldread.open_cold(str(cold)) as view:
        want = view.read("t", after=0, limit=1000)
    with tidelog.open(f"cold+file://{cold}") as store:
        assert store.topics() == ["t"]
        t = store.topic("t", create=False)
        got = t.read(after=0, limit=1000)
        assert got == want and got[0] == Tombstone(1, 5) and got[1].seq == 14
        state = t.state()
        assert (state.head_seq, state.earliest_seq, state.evict_floor, state.count) == (
            40, 14, 6, 27,
        )  # fmt: skip
        assert state.bytes == sum(len(r.payload) for r in got if isinstance(r, Record))
        with pytest.raises(ReadOnly, match="TIER-12"):
            t.append(b"x")
        with pytest.raises(ReadOnly, match="TIER-12"):
            store.topic("new")
        with pytest.raises(ReadOnly, match="TIER-12"):
            store.drop_topic("t")
        with pytest.raises(NotAvailable):
            t.delete(before_seq=20)
        with pytest.raises(NotAvailable):
            t.subscribe("s")
        with pytest.raises(tidelog.NoSuchTopic):
            store.topic("nope", create=False)
        assert store.describe()["cold"] == f"file://{cold}"
    with pytest.raises(BadOption, match="unknown option"):
        tidelog.open(f"cold+file://{cold}", nonsense=1)
    with pytest.raises(BadOption, match="read-only"):
        tidelog.open(f"cold+file://{cold}", readonly=False)


def test_TIER_12_a_pinned_version_and_refresh(tmp_path: Path) -> None:
    """TIER-12: manifest=v pins a version (refresh keeps it); unpinned, refresh moves to the
    newest once the store wrote one."""
    root, cold = _history(tmp_path)
    first = tidelog.open(f"cold+file://{cold}")
    version = first.describe()["manifest"]
    assert isinstance(version, int)
    pinned = tidelog.open(f"cold+file://{cold}?manifest={version}")
    s = _open(root, cold)
    s.topic("t").delete(before_seq=31)  # segments 11 and 21 leave the next version
    _tick(s)
    s.close()
    for store in (first, pinned):
        store.refresh()
    assert first.topic("t", create=False).state().count == 10
    assert first.describe()["manifest"] == version + 1
    assert pinned.topic("t", create=False).state().count == 27
    first.close()
    pinned.close()


def test_TIER_12_inspect_and_tail_of_a_cold_tier(tmp_path: Path) -> None:
    """TIER-12, CLI-3: tidelog inspect and tidelog tail read a cold+ URI."""
    _, cold = _history(tmp_path)
    runner = CliRunner()
    out = runner.invoke(main, ["inspect", "--json", f"cold+file://{cold}"])
    assert out.exit_code == 0, out.output
    report = json.loads(out.output)
    assert report["topics"]["t"]["state"]["head_seq"] == 40
    assert report["describe"]["cold"] == f"file://{cold}"
    out = runner.invoke(main, ["tail", f"cold+file://{cold}", "t", "--limit", "3"])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert lines[0].startswith("TOMBSTONE gap 1..5") and lines[1].startswith("14\t")


def test_TIER_12_TIER_13_a_cold_tier_on_s3_with_credentials_in_the_url(
    tmp_path: Path, s3_url: str
) -> None:
    """TIER-12 on moto's S3 server with the credentials in the URL; TIER-13: inspect, the
    store's repr and describe show the URL with the secret masked."""
    url = s3_url.replace("s3://", "s3://testing:T0PSECRET@", 1)
    s = _open(tmp_path / "s", s3_url, hot_retain_segments=1)
    _fill(s, 30)
    _tick(s)
    s.close()
    with tidelog.open(f"cold+{s3_url}") as store:  # the environment's credentials
        assert store.topic("t", create=False).state().head_seq == 20
    # a failing open (no such version) names the URL, never the secret
    with pytest.raises(tidelog.NotFound) as exc:
        tidelog.open(f"cold+{url}&manifest=99")
    assert "T0PSECRET" not in str(exc.value) and "testing:***@" in str(exc.value)
    monkey = pytest.MonkeyPatch()
    with monkey.context() as m:  # the URL's credentials are the only ones
        m.delenv("AWS_SECRET_ACCESS_KEY")
        good = s3_url.replace("s3://", "s3://testing:testing@", 1)
        with tidelog.open(f"cold+{good}") as store:
            assert "testing:***@" in repr(store) and "testing:testing" not in repr(store)
            assert store.describe()["cold"] == redact_url(good)
        out = CliRunner().invoke(main, ["inspect", f"cold+{good}"])
        assert out.exit_code == 0, out.output
        assert "testing:testing" not in out.output and "testing:***@" in out.output


def test_TIER_13_secrets_never_reach_a_message_or_repr(tmp_path: Path) -> None:
    """TIER-13: redact_url masks a userinfo password and secret query values, also in a URL
    nested in a file:// URI's cold=; a failing open's message (pyarrow's quoting the URL
    included) and the Spark source options' repr hold no secret."""
    assert redact_url("s3://AK:SEKRET@b/p?region=x") == "s3://AK:***@b/p?region=x"
    nested = "file:///x?cold=" + quote("s3://AK:SEKRET@b/p?secret_key=SK2", safe="")
    assert "SEKRET" not in redact_url(nested) and "SK2" not in redact_url(nested)
    assert redact_text("at 's3://AK:SEK RET@b'", "s3://AK:SEK RET@b") == "at 's3://AK:***@b'"
    for uri in (
        "cold+s3://AK:SEK RET@bkt/p",  # pyarrow quotes the URL it cannot parse
        "cold+s3://AK:SEKRET@bkt/p?endpoint_override=127.0.0.1:9&bogus=1",
        f"file://{tmp_path}/s?cold=" + quote("s3://AK:SEKRET@bkt/p?bogus=1", safe=""),
        "cold+s3://AK:SEKRET@bkt/p?x=1&x=2",  # tidelog's own parse error
    ):
        with pytest.raises(tidelog.TidelogError) as exc:
            tidelog.open(uri)
        assert "SEKRET" not in str(exc.value) and "SEK RET" not in str(exc.value), exc.value
        assert "AK:***@" in str(exc.value)
    cold = quote("s3://AK:SEKRET@bkt/p?endpoint_override=x:9", safe="")
    s = tidelog.open(f"file://{tmp_path}/t?cold={cold}")
    try:
        assert "SEKRET" not in repr(s) and "AK%3A%2A%2A%2A%40" in repr(s)
    finally:
        s.close()
    from tidelog.adapters.spark.options import parse_options

    opts = parse_options({"path": "cold+s3://AK:SEKRET@b/p", "topic": "t"})
    assert "SEKRET" not in repr(opts) and "AK:***@" in repr(opts)
