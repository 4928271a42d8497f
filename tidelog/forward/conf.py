"""Connect strings (spec/FORWARD.md FWD-1).

    ws::addr=127.0.0.1:9000;sf_dir=/var/lib/app/sf;sender_id=edge-7;request_durable_ack=on;

``schema::key=value;key=value;...`` with ``;;`` standing for a literal ``;`` inside a value. Every
key FWD-1 lists is accepted and validated; a key nobody defined is rejected (FWD-1: forward
compatibility comes from the spec, not from silently ignoring typos), and so is a repeated key.
tidelog's own keys are namespaced ``tidelog_*`` (FWD-1).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from tidelog.backends.sf.slot import DURABILITIES, check_sender_id
from tidelog.errors import BadOption
from tidelog.model.fsn import (
    DEFAULT_INITIAL_BACKOFF_MS,
    DEFAULT_MAX_BACKOFF_MS,
    DEFAULT_MAX_OUTAGE_MS,
    Policy,
)
from tidelog.options import parse_bool, parse_choice, parse_int, parse_size

__all__ = ["SenderConfig", "parse_conf", "POLICY_KEYS", "DEFAULT_PATH"]

DEFAULT_PORT: Final = 9000
DEFAULT_PATH: Final = "/write/v4"
_MEMORY_TOTAL: Final = 128 << 20
_SF_TOTAL: Final = 10 << 30

#: on_*_error key -> the categories it sets (FWD-1). on_server_error covers every category a
#: server status byte can carry; a category's own key wins over it (FWD-9).
POLICY_KEYS: Final[Mapping[str, tuple[str, ...]]] = {
    "on_schema_error": ("SCHEMA_MISMATCH",),
    "on_parse_error": ("PARSE_ERROR",),
    "on_internal_error": ("INTERNAL_ERROR",),
    "on_security_error": ("SECURITY_ERROR",),
    "on_write_error": ("WRITE_ERROR",),
}
_SERVER_CATEGORIES: Final = (
    "SCHEMA_MISMATCH",
    "PARSE_ERROR",
    "INTERNAL_ERROR",
    "SECURITY_ERROR",
    "WRITE_ERROR",
)


@dataclass(frozen=True)
class SenderConfig:
    """A parsed connect string. Fields are the connect-string key names (FWD-1)."""

    schema: str = "ws"
    addr: tuple[tuple[str, int], ...] = ()
    # §4.1 storage
    sf_dir: str | None = None
    sender_id: str = "default"
    sf_max_bytes: int = 4 << 20
    sf_max_total_bytes: int = _MEMORY_TOTAL
    sf_durability: str = "memory"
    sf_append_deadline_millis: int = 30_000
    drain_orphans: bool = False
    max_background_drainers: int = 4
    # §4.2 reconnect
    reconnect_max_duration_millis: int = DEFAULT_MAX_OUTAGE_MS
    reconnect_initial_backoff_millis: int = DEFAULT_INITIAL_BACKOFF_MS
    reconnect_max_backoff_millis: int = DEFAULT_MAX_BACKOFF_MS
    initial_connect_retry: str = "off"  # off | on | async (aliases normalised)
    close_flush_timeout_millis: int = 5_000
    # §4.3 durable ack
    request_durable_ack: bool = False
    durable_ack_keepalive_interval_millis: int = 200
    # §4.4 errors
    error_inbox_capacity: int = 256
    policy_overrides: Mapping[str, Policy] = field(default_factory=dict)
    # §4.5 other
    username: str | None = None
    password: str | None = None
    token: str | None = None
    tls_verify: bool = True
    tls_roots: str | None = None
    tls_roots_password: str | None = None
    auto_flush: bool = True
    auto_flush_rows: int | None = 1000
    auto_flush_bytes: int | None = None
    auto_flush_interval: int | None = 100
    init_buf_size: int = 64 << 10
    max_buf_size: int = 100 << 20
    max_name_len: int = 127
    max_schemas_per_connection: int = 65535
    # tidelog_* extensions
    tidelog_path: str = DEFAULT_PATH
    tidelog_client_id: str | None = None
    tidelog_connect_timeout_millis: int = 10_000
    tidelog_max_batch_frames: int = 256

    @property
    def client_id(self) -> str:
        """What the receiver de-duplicates by (X-QWP-Client-Id; FWD-20)."""
        return self.tidelog_client_id or self.sender_id

    @property
    def sf_mode(self) -> bool:
        return self.sf_dir is not None

    def with_changes(self, **changes: Any) -> SenderConfig:
        values = {k: getattr(self, k) for k in self.__dataclass_fields__}
        values.update(changes)
        return SenderConfig(**values)


def _millis(key: str, value: str) -> int:
    return parse_int(key, value, minimum=0)


def _off_or_int(key: str, value: str) -> int | None:
    return None if value.strip().lower() == "off" else parse_int(key, value, minimum=1)


def _policy(key: str, value: str) -> Policy:
    v = value.strip().upper()
    if v == "HALT":
        return "HALT"
    if v in ("DROP_AND_CONTINUE", "DROP"):
        return "DROP_AND_CONTINUE"
    raise BadOption(f"option {key}={value!r}: expected halt or drop_and_continue")


def _initial_retry(key: str, value: str) -> str:
    v = value.strip().lower()
    if v in ("off", "false"):
        return "off"
    if v in ("on", "sync", "true"):
        return "on"
    if v == "async":
        return "async"
    raise BadOption(f"option {key}={value!r}: expected off, on (sync, true) or async")


def _close_timeout(key: str, value: str) -> int:
    n = parse_int(key, value)
    if n < -1:
        raise BadOption(f"option {key}={value!r}: must be -1, 0 or a positive number of ms")
    return n


def _tls_verify(key: str, value: str) -> bool:
    return parse_choice(key, value.strip().lower(), ("on", "unsafe_off")) == "on"


def _path(key: str, value: str) -> str:
    if not value.startswith("/") or any(c in value for c in " ?#"):
        raise BadOption(f"option {key}={value!r}: expected a URL path such as /write/v4")
    return value


def _text(key: str, value: str) -> str:
    if not value:
        raise BadOption(f"option {key}: must not be empty")
    return value


def _sender_id(key: str, value: str) -> str:
    try:
        return check_sender_id(value)
    except ValueError as exc:
        raise BadOption(f"option {key}={value!r}: {exc}") from None


def _addr(key: str, value: str) -> tuple[tuple[str, int], ...]:
    out: list[tuple[str, int]] = []
    for part in value.split(","):
        part = part.strip()
        if not part:
            raise BadOption(f"option {key}={value!r}: empty host")
        if part.startswith("["):  # [v6]:port
            host, _, rest = part[1:].partition("]")
            port_text = rest[1:] if rest.startswith(":") else ""
        else:
            host, _, port_text = part.rpartition(":") if ":" in part else (part, "", "")
        port = parse_int(key, port_text, minimum=1, maximum=65535) if port_text else DEFAULT_PORT
        if not host:
            raise BadOption(f"option {key}={value!r}: empty host")
        out.append((host, port))
    return tuple(out)


_KEYS: Final[dict[str, Callable[[str, str], Any]]] = {
    "addr": _addr,
    "sf_dir": _text,
    "sender_id": _sender_id,
    "sf_max_bytes": parse_size,
    "sf_max_total_bytes": parse_size,
    "sf_durability": lambda k, v: parse_choice(k, v, DURABILITIES),
    "sf_append_deadline_millis": _millis,
    "drain_orphans": parse_bool,
    "max_background_drainers": lambda k, v: parse_int(k, v, minimum=1),
    "reconnect_max_duration_millis": _millis,
    "reconnect_initial_backoff_millis": lambda k, v: parse_int(k, v, minimum=1),
    "reconnect_max_backoff_millis": lambda k, v: parse_int(k, v, minimum=1),
    "initial_connect_retry": _initial_retry,
    "close_flush_timeout_millis": _close_timeout,
    "request_durable_ack": parse_bool,
    "durable_ack_keepalive_interval_millis": parse_int,
    "error_inbox_capacity": lambda k, v: parse_int(k, v, minimum=16),
    "on_server_error": _policy,
    **dict.fromkeys(POLICY_KEYS, _policy),
    "username": _text,
    "password": _text,
    "token": _text,
    "tls_verify": _tls_verify,
    "tls_roots": _text,
    "tls_roots_password": _text,
    "auto_flush": parse_bool,
    "auto_flush_rows": _off_or_int,
    "auto_flush_bytes": _off_or_int,
    "auto_flush_interval": _off_or_int,
    "init_buf_size": parse_size,
    "max_buf_size": parse_size,
    "max_name_len": lambda k, v: parse_int(k, v, minimum=1),
    "max_schemas_per_connection": lambda k, v: parse_int(k, v, minimum=1),
    "tidelog_path": _path,
    "tidelog_client_id": _text,
    "tidelog_connect_timeout_millis": lambda k, v: parse_int(k, v, minimum=1),
    "tidelog_max_batch_frames": lambda k, v: parse_int(k, v, minimum=1),
}
_SCHEMAS: Final = ("ws", "wss")
_NOT_SF: Final = ("http", "https", "tcp", "tcps", "udp")


def _split(text: str) -> list[tuple[str, str]]:
    """``k=v;k=v;`` with ``;;`` escaping a ``;`` in a value."""
    pairs: list[tuple[str, str]] = []
    i, n = 0, len(text)
    while i < n:
        eq = text.find("=", i)
        if eq < 0:
            rest = text[i:].strip()
            if rest:
                raise BadOption(f"connect string: {rest!r} is not key=value")
            break
        key = text[i:eq].strip()
        value: list[str] = []
        j = eq + 1
        while j < n:
            if text[j] == ";":
                if j + 1 < n and text[j + 1] == ";":
                    value.append(";")
                    j += 2
                    continue
                break
            value.append(text[j])
            j += 1
        if not key or ";" in key:
            raise BadOption(f"connect string: bad key {key!r}")
        pairs.append((key, "".join(value)))
        i = j + 1
    return pairs


def parse_conf(text: str, **overrides: Any) -> SenderConfig:
    """Parse a connect string (FWD-1) into a SenderConfig; ``overrides`` are already-typed
    field values applied afterwards (for programmatic use and tests).

    raises: BadOption naming the key (unknown, repeated, bad value, or inconsistent)
    """
    if not isinstance(text, str) or "::" not in text:
        raise BadOption(f"connect string {text!r}: expected ws::addr=host:port;...")
    schema, _, body = text.partition("::")
    schema = schema.strip().lower()
    if schema in _NOT_SF:
        raise BadOption(
            f"connect string schema {schema!r}: store-and-forward is WebSocket only (ws::, wss::)"
        )
    if schema not in _SCHEMAS:
        raise BadOption(f"connect string schema {schema!r}: expected ws or wss")
    values: dict[str, Any] = {}
    policies: dict[str, Policy] = {}
    server_policy: Policy | None = None
    seen: set[str] = set()
    for key, raw in _split(body):
        parser = _KEYS.get(key)
        if parser is None:
            raise BadOption(
                f"unknown connect-string key {key!r} (FWD-1); known keys: "
                f"{', '.join(sorted(_KEYS))}"
            )
        if key in seen:
            raise BadOption(f"connect-string key {key!r} given twice")
        seen.add(key)
        value = parser(key, raw)
        if key == "on_server_error":
            server_policy = value
        elif key in POLICY_KEYS:
            for category in POLICY_KEYS[key]:
                policies[category] = value
        else:
            values[key] = value
    if server_policy is not None:
        for category in _SERVER_CATEGORIES:
            policies.setdefault(category, server_policy)
    values["policy_overrides"] = policies
    values["schema"] = schema
    if "addr" not in values:
        raise BadOption("connect string: addr is required")
    if "sf_max_total_bytes" not in values:
        values["sf_max_total_bytes"] = _SF_TOTAL if "sf_dir" in values else _MEMORY_TOTAL
    values.update(overrides)
    return _check(SenderConfig(**values))


def _check(conf: SenderConfig) -> SenderConfig:
    if conf.reconnect_initial_backoff_millis > conf.reconnect_max_backoff_millis:
        raise BadOption(
            f"reconnect_initial_backoff_millis={conf.reconnect_initial_backoff_millis} exceeds "
            f"reconnect_max_backoff_millis={conf.reconnect_max_backoff_millis}"
        )
    if conf.sf_max_total_bytes < 2 * conf.sf_max_bytes:
        raise BadOption(
            f"sf_max_total_bytes={conf.sf_max_total_bytes} must be at least twice "
            f"sf_max_bytes={conf.sf_max_bytes}"
        )
    if (conf.username is None) != (conf.password is None):
        raise BadOption("username and password go together (HTTP Basic auth)")
    if conf.token is not None and conf.username is not None:
        raise BadOption("use either token or username/password, not both")
    if conf.drain_orphans and conf.sf_dir is None:
        raise BadOption("drain_orphans=on needs sf_dir (orphans are slots under it)")
    return conf
