"""The options of ``tidelog serve`` that belong to the HTTP service (spec/CLI.md lists them
all, SVC-56): one decorator adds them to the command, in the order ``--help`` shows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from .limits import Limits

__all__ = ["service_options", "SERVICE_OPTIONS"]

_INT = click.IntRange(min=0)

#: (flags, keyword arguments of click.option); each keyword reaches run_service by its name
SERVICE_OPTIONS: list[tuple[tuple[str, ...], dict[str, Any]]] = [
    (("--tokens",), {"default": None, "metavar": "FILE",
                     "help": "Bearer tokens with per-topic rights (SVC-47); SIGHUP reloads it."}),
    (("--no-auth",), {"is_flag": True,
                      "help": "Serve a non-loopback address without tokens (SVC-3)."}),
    (("--tls-cert",), {"default": None, "metavar": "FILE", "help": "Serve HTTPS (SVC-50)."}),
    (("--tls-key",), {"default": None, "metavar": "FILE", "help": "The certificate's key."}),
    (("--allow-plain-http",), {"is_flag": True,
                               "help": "Tokens over plain HTTP off loopback (SVC-50)."}),
    (("--priority",), {"multiple": True, "metavar": "GLOB=P",
                       "help": "Push priority of matching topics, -1000..1000 (SVC-36)."}),
    (("--delivery-workers",), {"default": 4, "show_default": True, "type": click.IntRange(1),
                               "help": "Scales the ready-set term of pressure (SVC-41)."}),
    (("--max-inflight-appends",), {"default": 1024, "show_default": True,
                                   "type": click.IntRange(1),
                                   "help": "Appends in flight; then wait or 429 (SVC-44)."}),
    (("--sse-heartbeat-ms",), {"default": 15_000, "show_default": True,
                               "type": click.IntRange(1),
                               "help": "A comment on an idle event stream this often (SVC-30)."}),
    (("--sse-stall-ms",), {"default": 30_000, "show_default": True, "type": click.IntRange(1),
                           "help": "Close a stream whose socket takes nothing (SVC-32)."}),
    (("--replay-window-ms",), {"default": 60_000, "show_default": True, "type": _INT,
                               "help": "How long answers are kept for request_id (SVC-25)."}),
    (("--metrics-max-topics",), {"default": 1000, "show_default": True, "type": _INT,
                                 "help": "Topics with their own metrics label (SVC-53)."}),
    (("--log-format",), {"default": "plain", "show_default": True,
                         "type": click.Choice(["plain", "json"]),
                         "help": "One line per request on stderr (SVC-55)."}),
    (("--shutdown-timeout-ms",), {"default": 10_000, "show_default": True, "type": _INT,
                                  "help": "Requests in flight may finish this long (SVC-57)."}),
]  # fmt: skip


def service_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add every service option, and SVC-51's limits (``Limits.options``, default None: the
    limit's own default), to a click command."""
    for option, _, default, help_text in reversed(Limits.options()):
        fn = click.option(option, default=None, help=f"{help_text} [default: {default}]")(fn)
    for flags, kwargs in reversed(SERVICE_OPTIONS):
        fn = click.option(*flags, **kwargs)(fn)
    return fn
