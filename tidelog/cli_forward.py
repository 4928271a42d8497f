"""``tidelog serve`` and ``tidelog forward`` (spec/FORWARD.md; registered on ``tidelog.cli.main``).

    tidelog serve --uri file:///var/lib/rx --topic events --port 9000
    tidelog forward "ws::addr=127.0.0.1:9000;sf_dir=/var/lib/sf;sender_id=edge-7;" --until-drained
    tidelog forward "ws::addr=127.0.0.1:9000;sender_id=edge-7;" --from file:///var/lib/app \\
        --topic events --until-drained
    seq 1 1000 | tidelog forward "ws::addr=...;sf_dir=/var/lib/sf;" --stdin --until-drained
"""

from __future__ import annotations

import dataclasses
import json
import logging
import socket
import sys
import time
from typing import Any

import click

from tidelog.cli_group import EXIT_FAILED, main, sigterm_as_interrupt
from tidelog.cli_open import open_existing
from tidelog.config import TopicConfig
from tidelog.errors import BadArgument
from tidelog.forward import Forwarder, Receiver
from tidelog.forward.budget import ServeLimits
from tidelog.forward.conf import _split, parse_conf
from tidelog.forward.instances import InstancesForwarder
from tidelog.fsio import storage_error
from tidelog.names import check_topic_name
from tidelog.service.options import service_options

__all__ = ["serve_cmd", "forward_cmd"]


def _option_pairs(pairs: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not key=value", param_hint="--topic-option")
        out[key] = value
    return out


def bind_listen(host: str, port: int) -> list[socket.socket]:
    """Resolve ``host`` and bind and listen on every address the receiver will serve
    (spec/CLI.md CLI-9): a busy port or a bad host is an error before anything is created, and
    the receiver takes these sockets, so no other process can take the port in between. Binds
    as asyncio's server does (SO_REUSEADDR; IPv6 sockets IPv6-only)."""
    try:
        infos = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        raise BadArgument(f"--host {host!r} does not resolve: {exc.strerror}") from None
    held: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            held.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(100)
    except OSError as exc:
        for sock in held:
            sock.close()
        raise storage_error(exc, f"cannot listen on {host}:{port}") from None
    return held


@main.command("serve")
@click.option("--uri", required=True, help="Store the receiver appends to (e.g. file:///rx).")
@click.option(
    "--topic",
    default=None,
    help="Also receive forwarded frames into this topic on /write/v4 (FWD-18; SVC-2).",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=9000, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--durable-ack/--no-durable-ack",
    default=True,
    show_default=True,
    help="Honour X-QWP-Request-Durable-Ack (off: behave like a server that cannot).",
)
@click.option(
    "--flush-interval-ms",
    default=10,
    show_default=True,
    type=click.IntRange(min=1),
    help="Group commit: how often appended frames are flushed and durable-acked.",
)
@click.option(
    "--max-frame-bytes",
    default="16MiB",
    show_default=True,
    help="Largest message read at all; larger: WebSocket close 1009 (FWD-25).",
)
@click.option(
    "--max-connection-bytes",
    default="64MiB",
    show_default=True,
    help="Bytes received and not yet appended per connection; then TCP pushes back (FWD-25).",
)
@click.option(
    "--max-total-bytes",
    default="256MiB",
    show_default=True,
    help="The same across all connections (FWD-25).",
)
@click.option(
    "--max-connections",
    default=64,
    show_default=True,
    type=int,
    help="Open connections; more are refused with HTTP 503 (FWD-25).",
)
@click.option(
    "--trust-fsn-jumps",
    is_flag=True,
    help="Accept a connection whose FSNs jump ahead of what is stored for its client id "
    "(topic sources with holes; FWD-26).",
)
@click.option(
    "--topic-option",
    "topic_options",
    multiple=True,
    metavar="KEY=VALUE",
    help="Topic config when the topic is created (e.g. durability=disk).",
)
@service_options
def serve_cmd(
    uri: str,
    topic: str | None,
    host: str,
    port: int,
    durable_ack: bool,
    flush_interval_ms: int,
    max_frame_bytes: str,
    max_connection_bytes: str,
    max_total_bytes: str,
    max_connections: int,
    trust_fsn_jumps: bool,
    topic_options: tuple[str, ...],
    **service: Any,
) -> None:
    """Serve the store at URI over HTTP (the API under /v0, spec/SERVICE.md); with --topic,
    receive forwarded frames over WebSocket (/write/v4) into that topic.

    The address is checked before the store is opened: a busy port or a host that does not
    resolve is one error line (exit 2) and creates nothing. Ctrl-C or SIGTERM stops it cleanly.
    """
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from tidelog.service.main import serve_api  # the HTTP stack loads only for serve

    if topic is None:
        serve_api(uri, host, port, service, bind_listen)
        return
    options = _option_pairs(topic_options)
    check_topic_name(topic)  # the receiver would create the store before refusing these
    TopicConfig.from_options(topic, options)
    limits = ServeLimits.parse(
        max_frame_bytes=max_frame_bytes,
        max_connection_bytes=max_connection_bytes,
        max_total_bytes=max_total_bytes,
        max_connections=max_connections,
    )
    made: list[Receiver] = []

    def receiver(store: Any) -> Receiver:
        """SVC-2: the receiver of --topic, on the service's listener and loop."""
        rx = Receiver(
            store,
            topic,
            host=host,
            durable_ack=durable_ack,
            flush_interval_ms=flush_interval_ms,
            **dataclasses.asdict(limits),
            trust_fsn_jumps=trust_fsn_jumps,
            topic_options=options,
        )
        made.append(rx)
        return rx

    try:
        serve_api(uri, host, port, service, bind_listen, receiver=receiver)
    finally:
        if made:
            click.echo(json.dumps({"receiver": made[0].stats}), err=True)


def _given_keys(conf: str) -> set[str]:
    return {key for key, _ in _split(conf.partition("::")[2])}


def _overrides(conf: str, from_stdin: bool, timeout: float | None) -> dict[str, Any]:
    """What the CLI changes in the connect string (spec/CLI.md CLI-8): with --stdin or
    --timeout the forwarder connects in the background unless the string says how, and with
    --timeout no single wait (a connect attempt, the final wait in close) outlasts it."""
    parsed = parse_conf(conf)  # a bad connect string fails here, before any source is opened
    out: dict[str, Any] = {}
    explicit = "initial_connect_retry" in _given_keys(conf)
    if timeout is not None:
        budget = max(1, int(timeout * 1000))
        out["tidelog_connect_timeout_millis"] = min(parsed.tidelog_connect_timeout_millis, budget)
        out["close_flush_timeout_millis"] = 0  # the command waits for acks itself, in budget
        if parsed.initial_connect_retry == "on":  # it would block in the constructor
            out["initial_connect_retry"] = "async"
    if (from_stdin or timeout is not None) and not explicit:
        out["initial_connect_retry"] = "async"
    return out


@main.command("forward")
@click.argument("conf", metavar="CONNECT_STRING")
@click.option("--from", "from_uri", help="Drain a tidelog topic of this store (else: the slot).")
@click.option("--topic", help="Topic to drain (with --from).")
@click.option("--subscriber", default="forward", show_default=True, help="Durable subscriber.")
@click.option(
    "--start",
    type=click.Choice(["earliest", "latest"]),
    default="earliest",
    show_default=True,
    help="Where a new subscriber starts.",
)
@click.option(
    "--stdin",
    "from_stdin",
    is_flag=True,
    help="Store each stdin line as a frame first (also while the receiver is down), then send.",
)
@click.option(
    "--until-drained",
    is_flag=True,
    help="Exit once everything is acknowledged (else exit 1 at --timeout or Ctrl-C).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.0),
    help="Give up after this many seconds, connecting included.",
)
def forward_cmd(
    conf: str,
    from_uri: str | None,
    topic: str | None,
    subscriber: str,
    start: str,
    from_stdin: bool,
    until_drained: bool,
    timeout: float | None,
) -> None:
    """Forward an SF slot (sf_dir/sender_id of CONNECT_STRING), the memory ring, or a topic
    (--from URI --topic NAME) to a receiver. Prints the counters as JSON at exit.

    Exit status: 0 done (with --until-drained: every frame acknowledged); 1 --until-drained
    ended with frames unacknowledged (they stay in the slot or topic); 2 the forwarder halted
    (one sender_error line) or another error. With --stdin or --timeout it connects in the
    background (initial_connect_retry=async), so --stdin stores every line before the receiver
    answers; initial_connect_retry=off in CONNECT_STRING fails at once instead.
    """
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    deadline = None if timeout is None else time.monotonic() + timeout
    if (from_uri is None) != (topic is None):
        raise click.UsageError("--from and --topic go together")
    if from_stdin and from_uri is not None:
        raise click.UsageError("--stdin appends to the slot; with --from append to the topic")
    sender = parse_conf(conf, **_overrides(conf, from_stdin, timeout))
    if from_stdin and sender.sf_dir is None:
        click.echo(
            "tidelog: warning: no sf_dir in the connect string: the lines are kept in memory "
            "and lost if they are not acknowledged before exit",
            err=True,
        )
    store = open_existing(from_uri) if from_uri is not None else None
    try:
        if store is not None:
            assert topic is not None
            fwd = Forwarder.for_topic(
                sender, store.topic(topic, create=False), subscriber=subscriber, start=start
            )
        else:
            fwd = Forwarder(sender)
        drained = False
        try:
            if from_stdin:
                for line in sys.stdin.buffer:
                    fwd.append(line[:-1] if line.endswith(b"\n") else line)
                fwd.flush()
            drained = _wait(fwd, until_drained, deadline)
        finally:
            counters: dict[str, Any] = fwd.counters()
            try:
                fwd.close()
            finally:
                counters["last_terminal_error"] = str(counters["last_terminal_error"] or "")
                click.echo(json.dumps(counters, sort_keys=True))
    finally:
        if store is not None:
            store.close()
    # A halt surfaces above as SenderFailed (from append/flush, or close()'s safety net): the
    # CLI turns it into one "tidelog: error: sender_error: ..." line (no_such_topic: a dropped
    # topic, FWD-35) and exit status 2.
    if until_drained and not drained:
        published, acked = counters["published_fsn"], counters["acked_fsn"]
        where = (
            "they are lost with this process (no sf_dir)"
            if store is None and sender.sf_dir is None
            else f"they stay in {fwd.source.name}"
        )
        after = "" if timeout is None else f" after {timeout:g} s"
        click.echo(
            f"tidelog: not drained: {published - acked} frames unacknowledged{after} "
            f"(published FSN {published}, acknowledged FSN {acked}); {where}",
            err=True,
        )
        raise SystemExit(EXIT_FAILED)


def _wait(fwd: Forwarder | InstancesForwarder, until_drained: bool, deadline: float | None) -> bool:
    """Wait until drained (with ``until_drained``), the deadline, a halt, or Ctrl-C/SIGTERM
    (the normal end without ``until_drained``, CLI-1); True if everything was acknowledged."""
    with sigterm_as_interrupt():
        try:
            while fwd.running and fwd.last_terminal_error is None:
                step = 0.5 if deadline is None else min(0.5, deadline - time.monotonic())
                if step <= 0:
                    break
                if until_drained:
                    if fwd.wait_acked(timeout=step):
                        return True
                else:
                    time.sleep(step)
        except KeyboardInterrupt:
            if until_drained:
                raise
    return fwd.acked_fsn >= fwd.published_fsn
