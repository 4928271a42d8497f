"""Backend descriptors (spec/SPEC.md REG-1..REG-6): what the registry declares per scheme, CAP-1
refused by the core from the capabilities, a bare factory registered as before, and a
third-party backend with a full descriptor reaching verify, the crash-test opener and hooks
through the core."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tidelog
from tidelog import registry
from tidelog.backend import Capabilities, StoreOptions
from tidelog.backends.common import Engine
from tidelog.backends.memory import MemoryBackend
from tidelog.clock import Clock, FakeClock
from tidelog.errors import BadArgument, Closed, NotAvailable
from tidelog.hooks import PROTOCOLS, Abandon, Checkpoint, EngineTopics, hooks, offers
from tidelog.registry import BackendDescriptor
from tidelog.report import Report
from tidelog.uri import URI, parse_uri

NO_QUEUE_NO_DELETES = Capabilities(deletes=False, queue=False, subscribers=False)


class _EngineBackend(Engine):
    """The full engine (it implements delete, subscribe and claim) claiming less: whatever it
    lacks can only be refused by the core."""

    def __init__(self, clock: Clock, caps: Capabilities) -> None:
        super().__init__(clock, StoreOptions(), caps)


class _Unclaimed:
    """A backend that claims no capabilities itself: its descriptor speaks for it (REG-4)."""

    def __init__(self, clock: Clock) -> None:
        self._engine = _EngineBackend(clock, NO_QUEUE_NO_DELETES)

    def __getattr__(self, name: str) -> Any:
        if name == "capabilities":
            raise AttributeError(name)
        return getattr(self._engine, name)


@pytest.fixture
def scheme() -> Iterator[str]:
    name = f"reg{uuid.uuid4().hex[:8]}"
    yield name
    registry.unregister(name)


def test_REG_1_a_descriptor_answers_without_importing_the_backend() -> None:
    """REG-1, REG-2: the built-in descriptors answer cheap questions (a path or a name, what a
    path names, a read-only view) with no backend module imported."""
    code = (
        "import sys, tidelog\n"
        "from tidelog import registry\n"
        "d = registry.descriptor('blockdev')\n"
        "assert d.location == 'path' and d.names == 'ring image or device' and d.read_only_view\n"
        "assert registry.descriptor('memory').location == 'name'\n"
        "assert not d.capabilities.queue and not d.capabilities.deletes\n"
        "print(sorted(m for m in sys.modules if m.startswith('tidelog.backends')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]", out.stdout


@pytest.mark.parametrize(
    "scheme_name", sorted(s for s, d in registry.DESCRIPTORS.items() if d.capabilities)
)
def test_REG_6_builtin_stores_claim_their_descriptor(scheme_name: str, tmp_path: Path) -> None:
    """REG-6, CAP-1: a store of each built-in scheme whose descriptor declares capabilities,
    default options, claims exactly them, and its backend offers every hook the descriptor
    names (a remote store claims the served store's: tests/unit/test_remote_backend.py)."""
    described = registry.descriptor(scheme_name)
    uri = {
        "file": f"file://{tmp_path}/store",
        "blockdev": f"blockdev://{tmp_path}/ring.img?size=64KiB",
        "sf": f"sf://{tmp_path}/sf/sender",
        "memory": "memory://",
        "model": "model://",
    }[scheme_name]
    with tidelog.open(uri) as store:
        assert store.capabilities == described.capabilities
        for name in described.hooks:
            assert offers(store, PROTOCOLS[name]), f"{scheme_name}:// lacks hook {name}"
    assert set(described.hooks) <= set(PROTOCOLS)


def test_REG_3_a_bare_factory_gets_the_default_descriptor(scheme: str) -> None:
    """REG-3, URI-1: a bare factory registers as before; its descriptor has the defaults (a
    name location, no capabilities of its own, no tools, no hooks); the store's capabilities
    are its backend's, and CAP-1 is refused from them."""
    registry.register(
        scheme, lambda uri, options, clock: _EngineBackend(clock, NO_QUEUE_NO_DELETES)
    )
    described = registry.descriptor(scheme)
    assert (described.location, described.capabilities, described.hooks) == ("name", None, set())
    assert not any(described.has(t) for t in ("detect", "verify", "fs_opener", "dispose"))
    with tidelog.open(f"{scheme}://x") as store:
        assert store.uri == f"{scheme}://x"  # a name: rendered as given
        assert store.capabilities == NO_QUEUE_NO_DELETES
        with pytest.raises(NotAvailable, match="does not offer Abandon"):
            hooks(store, Abandon)
        with pytest.raises(NotAvailable, match=f"{scheme}:// stores do not support queue mode"):
            store.topic("t").claim("n")


def test_REG_3_an_entry_point_may_name_a_descriptor(
    scheme: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """REG-3, URI-1: an entry point's value may name a descriptor instead of a factory."""
    from importlib.metadata import EntryPoint

    module = type(sys)("tidelog_reg_plugin")
    module.DESCRIPTOR = BackendDescriptor(  # type: ignore[attr-defined]
        "ignored", lambda uri, options, clock: _Unclaimed(clock), NO_QUEUE_NO_DELETES
    )
    monkeypatch.setitem(sys.modules, "tidelog_reg_plugin", module)
    eps = [EntryPoint(scheme, "tidelog_reg_plugin:DESCRIPTOR", registry.ENTRY_POINT_GROUP)]
    monkeypatch.setattr(
        registry, "entry_points", lambda group: [e for e in eps if e.group == group]
    )
    assert registry.descriptor(scheme).scheme == scheme
    with tidelog.open(f"{scheme}://") as store:  # the backend claims nothing: the descriptor
        assert store.capabilities == NO_QUEUE_NO_DELETES
        with pytest.raises(NotAvailable, match="deletes"):
            store.topic("t").delete(1)


def test_REG_4_the_core_refuses_what_the_capabilities_lack(scheme: str) -> None:
    """REG-4, CAP-1: a backend whose capabilities lack deletes, subscribers and queue gets every
    refusal from the core (its engine would have done each op), with the descriptor's message,
    after the arguments are checked and after a closed store is reported."""
    registry.register(
        scheme,
        BackendDescriptor(
            scheme,
            lambda uri, options, clock: _Unclaimed(clock),
            NO_QUEUE_NO_DELETES,
            refusals={"queue": "no jobs here"},
        ),
    )
    store = tidelog.open(f"{scheme}://")
    t = store.topic("t")
    t.append_many([b"a", b"b"])
    refused = {
        "delete": lambda: t.delete(1),
        "subscribe": lambda: t.subscribe("s"),
        "poll": lambda: tidelog.Subscriber(t, "s").poll(),
        "ack": lambda: tidelog.Subscriber(t, "s").ack(1),
        "commit": lambda: tidelog.Subscriber(t, "s").commit(1),
        "hwm": lambda: tidelog.Subscriber(t, "s").hwm,
        "claim": lambda: t.claim("n"),
        "complete": lambda: t.complete(1, 1),
        "release": lambda: t.release(1, 1),
        "nack": lambda: t.nack(1, 1),
    }
    for op, call in refused.items():
        with pytest.raises(NotAvailable) as caught:
            call()
        assert caught.value.code == "not_available", op
    with pytest.raises(NotAvailable, match=r"^no jobs here$"):
        t.claim("n")
    with pytest.raises(NotAvailable, match=f"{scheme}:// stores do not support deletes"):
        t.delete(1)
    assert t.subscribers() == []  # listing is not refused: there are none
    assert t.state().count == 2  # nothing was deleted
    with pytest.raises(BadArgument):  # arguments first
        t.complete(0, 1)
    with pytest.raises(BadArgument):
        tidelog.Subscriber(t, "s").ack(0)
    store.close()
    with pytest.raises(Closed):  # then a closed store
        t.claim("n")


def test_REG_4_builtin_refusal_messages_are_the_descriptors(tmp_path: Path) -> None:
    """REG-4: blockdev's and sf's refusals come from their descriptors, word for word."""
    with tidelog.open(f"blockdev://{tmp_path}/r.img?size=64KiB&topic=t") as store:
        t = store.topic("t")
        with pytest.raises(NotAvailable, match=r"^deletes are not available on blockdev \(the"):
            t.delete(1)
        with pytest.raises(NotAvailable, match=r"^queue mode is not available on blockdev$"):
            t.nack(1, 1)
    with tidelog.open(f"sf://{tmp_path}/sf/edge") as store:
        frames = store.topic("frames")
        with pytest.raises(NotAvailable, match=r"^sf:// stores do not support subscribers: an"):
            frames.subscribe("s")
        with pytest.raises(NotAvailable, match=r"^sf:// stores do not support queue mode: an"):
            frames.claim("n")


# -- a third-party backend with a full descriptor (REG-5) -------------------------------------
MARKER = "ACME-STORE"


def _acme_detect(fs: Any, path: str) -> bool:
    try:
        return fs.is_dir(path) and MARKER in fs.listdir(path)
    except OSError:
        return False


def _acme_verify(fs: Any, path: str) -> Report:
    report = Report(path)
    report.files_checked = len(fs.listdir(path))
    return report


def _acme_factory(uri: URI, options: dict[str, object], clock: Clock) -> Any:
    from tidelog.backends.file import open_backend

    os.makedirs(uri.location, exist_ok=True)
    return open_backend(parse_uri(f"file://{uri.location}"), options, clock)


def _acme_fs_opener(fs: Any, location: str, clock: Clock, **options: object) -> Any:
    from tidelog.backends.file import open_store

    return open_store(fs, location, clock, **options)


disposed: list[str] = []


def _acme(scheme: str) -> BackendDescriptor:
    return BackendDescriptor(
        scheme,
        _acme_factory,
        Capabilities(persistent=True, crash_safe=True),
        location="path",
        names="acme store",
        dot_relative=True,
        hooks=frozenset({"abandon", "checkpoint", "topics"}),
        detect=_acme_detect,
        verify=_acme_verify,
        fs_opener=_acme_fs_opener,
        dispose=lambda uri: disposed.append(uri.location),
    )


def test_REG_5_a_full_descriptor_brings_verify_opener_and_hooks(
    scheme: str, tmp_path: Path
) -> None:
    """REG-5, REG-2: a third-party backend registered with a full descriptor is recognised and
    checked by ``tidelog verify``, opened on the recording FS by the conformance kit (power
    loss between and during ops), its hooks reached through ``tidelog.hooks``, its stores
    disposed of, and its location treated as a path."""
    from tidelog.cli_open import file_location, has_read_only_view
    from tidelog.conformance.suite import BackendSuite
    from tidelog.conformance.sut import LocalSut
    from tidelog.verify import detect, verify_path

    registry.register(scheme, _acme(scheme))
    acme = tmp_path / "acme"
    acme.mkdir()
    (acme / MARKER).write_text("")
    assert detect(str(acme)) == scheme
    assert verify_path(str(acme)).files_checked == 1  # the descriptor's verify ran

    assert parse_uri(f"{scheme}://rel/x").render() == f"{scheme}://./rel/x"
    assert file_location(f"{scheme}://{acme}") == str(acme)
    assert not has_read_only_view(f"{scheme}://{acme}")

    sut = LocalSut(f"{scheme}:///stores/{{name}}", fs="recording")
    assert sut.hello["crash"] == ["between", "during"] and sut.hello["power_loss"]
    store = sut.open("s1", FakeClock(1_000_000))
    store.topic("t", durability="fsync").append(b"x")
    hooks(store, Checkpoint).checkpoint()
    assert list(hooks(store, EngineTopics).topics) == ["t"]
    sut.crash(seed=1)  # abandon() through the hook, then a power-loss state of the FS
    again = sut.open("s1", FakeClock(1_000_001))
    assert [r.seq for r in again.topic("t").read()] == [1]
    sut.shutdown()

    os_sut = LocalSut(f"{scheme}://{tmp_path}/{{name}}")
    os_sut.open("s2", FakeClock(1)).close()
    os_sut.dispose("s2")
    assert disposed[-1] == f"{tmp_path}/s2"

    acme_scheme = scheme

    class AcmeSuite(BackendSuite):  # defined here: not collected
        scheme = acme_scheme

        def store_uri(self, name: str) -> str:
            return f"{self.scheme}://{tmp_path}/{name}"

    assert AcmeSuite.capabilities == Capabilities(persistent=True, crash_safe=True)
    assert AcmeSuite.fs_opener is not None and AcmeSuite.verify_format == scheme
    assert callable(AcmeSuite.test_level_crash) and callable(AcmeSuite.test_format_roundtrip)


def test_REG_5_hooks_refuse_what_a_backend_does_not_offer() -> None:
    """REG-5: ``hooks`` returns the backend typed as the protocol or class asked for, and
    raises not_available naming the store and the hook otherwise."""
    with tidelog.open("memory://") as store:
        assert isinstance(hooks(store, MemoryBackend), MemoryBackend)
        assert offers(store, EngineTopics) and not offers(store, Abandon)
        with pytest.raises(NotAvailable, match=r"memory://: its backend does not offer Checkpoint"):
            hooks(store, Checkpoint)
