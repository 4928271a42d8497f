"""Tokens, rights, TLS, the start-up checks and the limits of ``tidelog serve`` (spec/SERVICE.md
SVC-47..SVC-51), and the service's error codes (SPEC.md ERR-1). Each part is tested on its own here;
the HTTP answers (401/403 with their headers) are tested through the app."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import ipaddress
import json
import pickle
import socket
import ssl
import threading
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tidelog.errors import (
    ERROR_CODES,
    BadOption,
    Busy,
    Forbidden,
    Internal,
    Throttled,
    TidelogError,
    Unauthorized,
)
from tidelog.service import auth
from tidelog.service.auth import (
    ANYONE,
    Authorizer,
    check_listen,
    hash_token,
    is_loopback,
    load_tokens,
    server_ssl_context,
)
from tidelog.service.limits import Limits

INGEST = "tok-ingest-5f1d"
OPS = "tok-ops-93ab"
READER = "tok-reader-77c2"


def _tokens_doc() -> dict[str, Any]:
    return {
        "tokens": [
            {
                "name": "ingest",
                "sha256": hash_token(INGEST),
                "grants": [
                    {"topics": "sensor-*", "rights": ["write"]},
                    {"topics": "sensor-a*", "rights": ["read"]},
                ],
                "unthrottled": True,
            },
            {
                "name": "ops",
                "sha256": hash_token(OPS).upper(),  # hex of either case
                "grants": [{"topics": "*", "rights": ["admin", "read"]}],
            },
            {
                "name": "reader",
                "sha256": hash_token(READER),
                "grants": [{"topics": "?*", "rights": ["read", "admin"]}],
            },
        ]
    }


def _write(path: Path, doc: object) -> str:
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc), encoding="utf-8")
    return str(path)


@pytest.fixture
def tokens_file(tmp_path: Path) -> str:
    return _write(tmp_path / "tokens.json", _tokens_doc())


def _bearer(token: str) -> str:
    return f"Bearer {token}"


# -- SVC-47: the tokens file -------------------------------------------------------------------


def test_SVC_47_a_token_is_known_by_the_sha256_the_file_holds(tokens_file: str) -> None:
    """SVC-47: the file holds SHA-256 hashes (hex, either case); the presented bearer token is
    hashed and found, with its name and `unthrottled` flag (default false)."""
    authz = Authorizer(tokens_file)
    assert hash_token("abc") == (
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"  # FIPS 180-2's vector
    )
    ingest = authz.check(_bearer(INGEST), "any", None)
    assert (ingest.name, ingest.unthrottled) == ("ingest", True)
    ops = authz.check("bearer  " + OPS + " ", "any", None)  # RFC 6750: scheme in any case
    assert (ops.name, ops.unthrottled) == ("ops", False)
    assert authz.names == ["ingest", "ops", "reader"]
    assert INGEST not in repr(ingest) and hash_token(INGEST) not in repr(ingest)


def test_SVC_47_no_tokens_file_gives_every_right() -> None:
    """SVC-47: without --tokens every request, with or without a header, has every right on
    every topic and store-wide, and may bypass throttling."""
    authz = Authorizer(None)
    assert authz.open
    for header in (None, "", "Bearer whatever", "Basic eA=="):
        for right in ("read", "write", "admin", "any", "none"):
            assert authz.check(header, right, "t") is ANYONE
            assert authz.check(header, right, None) is ANYONE
    assert ANYONE.name is None and ANYONE.unthrottled
    assert ANYONE.readable(["b", "a"]) == ["b", "a"]
    assert authz.reload() is None


def _entry(**over: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": "n",
        "sha256": hash_token("t"),
        "grants": [{"topics": "*", "rights": ["read"]}],
    }
    entry.update(over)
    return {k: v for k, v in entry.items() if v is not None}


BAD_FILES = [
    ("[1, 2", "not valid JSON"),
    (b"\xff\xfe".decode("latin-1"), "not valid JSON"),
    ([], "top level: expected an object"),
    ({"tokens": [], "extra": 1}, "top level: unknown key 'extra'"),
    ({}, "top level: missing key 'tokens'"),
    ({"tokens": {}}, "tokens: expected a list"),
    ({"tokens": [_entry(sha256="ab" * 31)]}, "tokens[0].sha256: expected the 64 hex digits"),
    ({"tokens": [_entry(sha256="zz" * 32)]}, "tokens[0].sha256: expected the 64 hex digits"),
    ({"tokens": [_entry(sha256=None)]}, "tokens[0]: missing key 'sha256'"),
    ({"tokens": [_entry(name="")]}, "tokens[0].name: expected 1-128 printable characters"),
    ({"tokens": [_entry(name="a\nb")]}, "tokens[0].name: expected 1-128 printable characters"),
    ({"tokens": [_entry(token="secret")]}, "tokens[0]: unknown key 'token'"),
    ({"tokens": [_entry(grants={})]}, "tokens[0].grants: expected a list"),
    (
        {"tokens": [_entry(grants=[{"topics": "a", "rights": ["read", "wirte"]}])]},
        "tokens[0].grants[0].rights[1]: 'wirte' is not a right (read, write, admin)",
    ),
    (
        {"tokens": [_entry(grants=[{"topics": "a", "rights": []}])]},
        "tokens[0].grants[0].rights: expected a non-empty list",
    ),
    (
        {"tokens": [_entry(grants=[{"topics": "", "rights": ["read"]}])]},
        "tokens[0].grants[0].topics: expected a non-empty glob string",
    ),
    ({"tokens": [_entry(unthrottled="yes")]}, "tokens[0].unthrottled: expected true or false"),
    ({"tokens": [_entry(), _entry(sha256=hash_token("u"))]}, "tokens[1].name: 'n' is given twice"),
    ({"tokens": [_entry(), _entry(name="m")]}, "tokens[1].sha256: the same hash as an earlier"),
]


@pytest.mark.parametrize(("doc", "says"), BAD_FILES)
def test_SVC_47_a_bad_tokens_file_is_bad_option_naming_it(
    tmp_path: Path, doc: object, says: str
) -> None:
    """SVC-47: a tokens file that is not JSON, has an unknown or missing key, a hash that is not
    64 hex digits, an unknown right, or a name or hash twice is `bad_option` naming the file
    and the place in it (a typo is never silently ignored)."""
    path = _write(tmp_path / "tokens.json", doc)
    with pytest.raises(BadOption) as err:
        load_tokens(path)
    assert path in err.value.message and says in err.value.message and "SVC-47" in err.value.message
    with pytest.raises(BadOption):
        Authorizer(path)


def test_SVC_47_a_missing_tokens_file_is_bad_option(tmp_path: Path) -> None:
    """SVC-47: a tokens file that cannot be read is `bad_option` naming it, not an OSError."""
    path = str(tmp_path / "absent.json")
    with pytest.raises(BadOption, match=r"absent\.json: cannot read it"):
        Authorizer(path)


def test_SVC_47_every_entry_is_compared_in_constant_time(
    tokens_file: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SVC-47: the presented token's hash is compared with every entry with
    `hmac.compare_digest`, also after a match, so the time tells nothing about the file."""
    calls: list[tuple[bytes, bytes]] = []
    real = auth.hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", counting)
    authz = Authorizer(tokens_file)
    for token in (INGEST, "not-a-token"):
        calls.clear()
        with contextlib.suppress(Unauthorized):
            authz.check(_bearer(token), "any", None)
        assert len(calls) == 3


# -- SVC-48: rights ----------------------------------------------------------------------------


def test_SVC_48_rights_are_the_union_of_the_matching_grants(tokens_file: str) -> None:
    """SVC-48: `topics` is an `fnmatchcase` glob; a token's rights on a topic are the union of
    the grants whose glob matches it; a right no grant gives is missing (no right implies
    another)."""
    ingest = Authorizer(tokens_file).check(_bearer(INGEST), "any", None)
    assert ingest.can("write", "sensor-b") and not ingest.can("read", "sensor-b")
    assert ingest.can("write", "sensor-a1") and ingest.can("read", "sensor-a1")
    assert not ingest.can("write", "Sensor-a1")  # case matters, as DEL-3
    assert not ingest.can("admin", "sensor-a1")
    assert not ingest.can("write", "other")
    assert ingest.can("any", "other") and ingest.can("none", None)
    assert ingest.readable(["sensor-b", "sensor-a2", "x", "sensor-a"]) == ["sensor-a2", "sensor-a"]


def test_SVC_48_store_wide_needs_a_grant_on_exactly_star(tokens_file: str) -> None:
    """SVC-48: a right store-wide (topic None: flush, refresh, metrics) is given only by a grant
    whose glob is exactly `*`; a glob that happens to match every name (`?*`) gives it on every
    topic, but not store-wide."""
    authz = Authorizer(tokens_file)
    ops = authz.check(_bearer(OPS), "admin", None)
    assert ops.name == "ops" and ops.can("read", None) and not ops.can("write", None)
    reader = authz.check(_bearer(READER), "admin", "any-topic")
    assert reader.can("admin", "x") and not reader.can("admin", None)
    with pytest.raises(Forbidden, match=r"'reader' has no admin right store-wide"):
        authz.check(_bearer(READER), "admin", None)
    with pytest.raises(TidelogError, match="right 'rwx'"):
        ops.can("rwx", "t")


# -- SVC-49: 401 and 403, reloads --------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "says"),
    [
        (None, "no token"),
        ("   ", "no token"),
        (f"Basic {INGEST}", "scheme 'Basic' is not Bearer"),
        ("Bearer", "scheme"),  # no space: the scheme is 'Bearer' with no token after it
        ("Bearer   ", "no token"),
        ("Bearer tok-unknown", "unknown bearer token"),
        (f"Bearer {INGEST}x", "unknown bearer token"),
    ],
)
def test_SVC_49_no_token_or_an_unknown_one_is_401(
    tokens_file: str, header: str | None, says: str
) -> None:
    """SVC-49: no token, another scheme, an empty or an unknown token is `unauthorized`, for
    every right but `none`; the message never repeats what was sent."""
    authz = Authorizer(tokens_file)
    for right, topic in (("any", None), ("read", "sensor-a"), ("admin", None)):
        with pytest.raises(Unauthorized) as err:
            authz.check(header, right, topic)
        assert says in err.value.message or "empty bearer token" in err.value.message
        assert "tok-" not in err.value.message and err.value.code == "unauthorized"


def test_SVC_49_a_known_token_without_the_right_is_403(tokens_file: str) -> None:
    """SVC-49: a known token without the right is `forbidden`, naming the token's name (never
    the token) and the topic it asked for; the same answer whether the topic exists or not
    (check looks nothing up)."""
    authz = Authorizer(tokens_file)
    with pytest.raises(Forbidden) as err:
        authz.check(_bearer(INGEST), "read", "sensor-b")
    assert err.value.code == "forbidden"
    assert "'ingest' has no read right on topic 'sensor-b'" in err.value.message
    assert INGEST not in err.value.message
    assert authz.check(_bearer(INGEST), "write", "sensor-b").name == "ingest"


def test_SVC_48_health_needs_no_token(tokens_file: str) -> None:
    """SVC-48: `/v0/health` needs none: `check(..., "none", ...)` never raises; it names the
    token when a known one is sent (for the log line), else nobody."""
    authz = Authorizer(tokens_file)
    assert authz.check(None, "none", None).name is None
    assert authz.check("Bearer nope", "none", None) == auth.Principal(None, ())
    assert authz.check(_bearer(OPS), "none", None).name == "ops"


def test_SVC_49_reload_takes_a_good_file_and_keeps_the_old_tokens_on_a_bad_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """SVC-49: SIGHUP's reload: a file that does not load keeps the old tokens and says (logs and
    returns) why; a good one takes effect and counts a generation; `recheck` tells a stream
    whose token was removed (401) or lost the right (403)."""
    path = tmp_path / "tokens.json"
    _write(path, _tokens_doc())
    authz = Authorizer(str(path))
    ingest = authz.check(_bearer(INGEST), "read", "sensor-a")
    ops = authz.check(_bearer(OPS), "read", "x")
    _write(path, "{not json")
    with caplog.at_level("WARNING", logger="tidelog.service.auth"):
        why = authz.reload()
    assert why is not None and "not valid JSON" in why and str(path) in why
    assert why in caplog.text and authz.generation == 0
    assert authz.check(_bearer(INGEST), "read", "sensor-a").name == "ingest"

    doc = _tokens_doc()
    del doc["tokens"][1]  # ops goes
    doc["tokens"][0]["grants"] = [{"topics": "sensor-*", "rights": ["write"]}]  # ingest: no read
    _write(path, doc)
    assert authz.reload() is None and authz.generation == 1
    with pytest.raises(Unauthorized, match="'ops' is no longer in the tokens file"):
        authz.recheck(ops, "read", "x")
    with pytest.raises(Forbidden, match="no read right on topic 'sensor-a'"):
        authz.recheck(ingest, "read", "sensor-a")
    assert authz.recheck(ingest, "write", "sensor-a").grants == (
        auth.Grant("sensor-*", frozenset({"write"})),
    )
    with pytest.raises(Unauthorized):
        authz.check(_bearer(OPS), "any", None)


# -- SVC-50: TLS and the start-up checks -------------------------------------------------------


def _self_signed(folder: Path, *, password: bytes | None = None) -> tuple[str, str]:
    """A self-signed certificate for localhost and 127.0.0.1, and its key, as PEM files in a
    new ``folder``."""
    folder.mkdir()
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    encryption: serialization.KeySerializationEncryption = (
        serialization.NoEncryption()
        if password is None
        else serialization.BestAvailableEncryption(password)
    )
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    )
    return str(cert_path), str(key_path)


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> str | None:
    """One TLS connection on 127.0.0.1 between the two contexts: the version it agreed."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(10)
    failures: list[BaseException] = []

    def serve() -> None:
        try:
            conn, _ = listener.accept()
            with server.wrap_socket(conn, server_side=True) as tls:
                tls.sendall(b"ok")
        except (OSError, ssl.SSLError) as exc:
            failures.append(exc)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        with (
            socket.create_connection(listener.getsockname(), timeout=10) as raw,
            client.wrap_socket(raw, server_hostname="localhost") as tls,
        ):
            assert tls.recv(2) == b"ok"
            return tls.version()
    finally:
        thread.join(10)
        listener.close()
        assert not thread.is_alive() and failures == []


def test_SVC_50_the_tls_context_serves_tls_1_2_and_later(tmp_path: Path) -> None:
    """SVC-50: with a certificate and its key the server's context does TLS 1.2 or later (the
    minimum is set, not left to the system's configuration): a client that trusts the
    certificate completes a handshake, also one that offers at most TLS 1.2."""
    cert, key = _self_signed(tmp_path / "tls")
    server = server_ssl_context(cert, key)
    assert server.minimum_version == ssl.TLSVersion.TLSv1_2
    client = ssl.create_default_context(cafile=cert)
    assert _handshake(server, client) in ("TLSv1.2", "TLSv1.3")
    client12 = ssl.create_default_context(cafile=cert)
    client12.maximum_version = ssl.TLSVersion.TLSv1_2
    assert _handshake(server, client12) == "TLSv1.2"


def test_SVC_50_a_bad_certificate_or_key_is_bad_option(tmp_path: Path) -> None:
    """SVC-50: a certificate or key that is missing, not PEM, not the certificate's key, or
    encrypted (which would make OpenSSL prompt on the terminal) is `bad_option` naming it."""
    cert, key = _self_signed(tmp_path / "tls")
    _, other_key = _self_signed(tmp_path / "other")
    _, locked_key = _self_signed(tmp_path / "locked", password=b"pw")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    cases = [
        ((str(tmp_path / "absent.pem"), key), "--tls-cert .*absent.pem: cannot read it"),
        ((cert, str(tmp_path / "absent.key")), "--tls-key .*absent.key: cannot read it"),
        ((str(garbage), key), "garbage.pem .* not a usable PEM certificate"),
        ((cert, str(garbage)), "garbage.pem: not a usable PEM certificate"),
        ((cert, other_key), "not a usable PEM certificate and matching"),
        ((cert, locked_key), "encrypted"),
    ]
    for (c, k), says in cases:
        with pytest.raises(BadOption, match=says):
            server_ssl_context(c, k)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.0.1", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        ("192.0.2.7", False),
        ("2001:db8::1", False),
    ],
)
def test_SVC_47_which_addresses_are_loopback(host: str, loopback: bool) -> None:
    """SVC-47: an address is loopback when every address it names is (127.0.0.0/8, ::1, also
    IPv4-mapped); the wildcard addresses and "" mean every interface."""
    assert is_loopback(host) is loopback


@pytest.mark.parametrize(
    ("host", "tokens", "tls", "no_auth", "plain", "says"),
    [
        ("127.0.0.1", None, False, False, False, None),
        ("::1", "t.json", False, False, False, None),
        ("0.0.0.0", None, False, False, False, "not a loopback address: give --tokens"),
        ("0.0.0.0", None, False, True, False, None),
        ("0.0.0.0", None, True, True, False, None),
        ("0.0.0.0", "t.json", False, False, False, "over plain HTTP"),
        ("0.0.0.0", "t.json", False, False, True, None),
        ("0.0.0.0", "t.json", True, False, False, None),
        ("127.0.0.1", "t.json", False, True, False, "--no-auth and --tokens contradict"),
    ],
)
def test_SVC_50_start_up_checks_of_address_tokens_and_tls(
    host: str, tokens: str | None, tls: bool, no_auth: bool, plain: bool, says: str | None
) -> None:
    """SVC-47, SVC-50: before anything is bound or opened, a non-loopback address without
    --tokens is refused unless --no-auth, tokens over plain HTTP to a non-loopback address are
    refused unless --allow-plain-http, and --no-auth with --tokens is a contradiction."""
    if says is None:
        check_listen(host, tokens, tls, no_auth, plain)
    else:
        with pytest.raises(BadOption, match=says):
            check_listen(host, tokens, tls, no_auth, plain)


# -- ERR-1: the service's codes ----------------------------------------------------------------


def test_ERR_1_the_service_codes_have_their_classes() -> None:
    """ERR-1: the codes raised by the service and the remote backend have their classes in
    ERROR_CODES (so a client maps a code back to its class); `throttled` and `busy` carry
    `retry_after_ms` (1000 unless said), kept across pickling."""
    codes = {
        "unauthorized",
        "forbidden",
        "not_found",
        "method_not_allowed",
        "request_timeout",
        "unsupported_media_type",
        "headers_too_large",
        "throttled",
        "busy",
        "internal",
    }
    assert codes <= set(ERROR_CODES)
    assert ERROR_CODES["internal"] is Internal and ERROR_CODES["throttled"] is Throttled
    assert Busy("full").retry_after_ms == 1000
    again = pickle.loads(pickle.dumps(Throttled("slow down", retry_after_ms=300)))
    assert isinstance(again, Throttled)
    assert (again.message, again.retry_after_ms, again.code) == ("slow down", 300, "throttled")


# -- SVC-51: limits ----------------------------------------------------------------------------


def test_SVC_51_limits_defaults_and_what_get_v0_shows() -> None:
    """SVC-51: every limit has its default, is an option named after it, and `to_dict` (the
    `limits` of `GET /v0`) shows each by its name."""
    assert Limits().to_dict() == {
        "max_request_bytes": 16 << 20,
        "max_batch": 10_000,
        "max_header_bytes": 16 << 10,
        "request_timeout_ms": 30_000,
        "keepalive_timeout_ms": 60_000,
        "max_http_connections": 1024,
        "max_streams": 4096,
        "max_streams_per_token": 256,
        "max_wait_ms": 30_000,
        "max_staged_bytes": 4 << 30,
        "staged_ttl_ms": 3_600_000,
    }
    options = Limits.options()
    assert [(o, n) for o, n, _, _ in options][:2] == [
        ("--max-request-bytes", "max_request_bytes"),
        ("--max-batch", "max_batch"),
    ]
    assert {n: d for _, n, d, _ in options} == Limits().to_dict()
    assert all(h for _, _, _, h in options)


def test_SVC_51_limits_from_options() -> None:
    """SVC-51: options as the command line gives them (strings; sizes in binary units; None
    for an option not given) set the limits; the record is frozen."""
    limits = Limits.from_options(
        max_request_bytes="1MiB", max_batch="5", max_wait_ms=0, max_streams=None
    )
    assert (limits.max_request_bytes, limits.max_batch, limits.max_wait_ms) == (1 << 20, 5, 0)
    assert limits.max_streams == 4096
    with pytest.raises(dataclasses.FrozenInstanceError):
        limits.max_batch = 6  # type: ignore[misc]


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"max_request_bytes": "1023"}, "max_request_bytes='1023': must be at least 1KiB"),
        ({"max_request_bytes": "2GiB"}, "must be at most 1GiB"),
        ({"max_request_bytes": "16MB"}, "MB is ambiguous"),
        ({"max_batch": 0}, "max_batch=0: must be at least 1"),
        ({"max_batch": "many"}, "expected an integer"),
        ({"max_wait_ms": 3_600_001}, "must be at most 3600000"),
        ({"max_streams": -1}, "must be at least 0"),
        ({"max_bacth": 5}, "'max_bacth': not a limit of tidelog serve"),
    ],
)
def test_SVC_51_a_limit_out_of_range_is_bad_option(options: dict[str, object], says: str) -> None:
    """SVC-51: a limit out of its range, of the wrong form, or unknown is `bad_option` naming
    it and the value."""
    with pytest.raises(BadOption) as err:
        Limits.from_options(**options)
    assert says in err.value.message
