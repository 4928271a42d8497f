"""``tidelog serve`` and ``tidelog forward`` (spec/FORWARD.md; registered on ``tidelog.cli.main``).

    tidelog serve --uri file:///var/lib/rx --topic events --port 9000
    tidelog forward "ws::addr=127.0.0.1:9000;sf_dir=/var/lib/sf;sender_id=edge-7;" --until-drained
    tidelog forward "ws::addr=127.0.0.1:9000;sender_id=edge-7;" --from file:///var/lib/app \\
        --topic events --until-drained
    seq 1 1000 | tidelog forward "ws::addr=...;sf_dir=/var/lib/sf;" --stdin --until-drained
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
from typing import Any

import click

import tidelog
from tidelog.cli import main
from tidelog.forward import Forwarder, Receiver

__all__ = ["serve_cmd", "forward_cmd"]


def _option_pairs(pairs: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not key=value", param_hint="--topic-option")
        out[key] = value
    return out


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


@main.command("serve")
@click.option("--uri", required=True, help="Store the receiver appends to (e.g. file:///rx).")
@click.option("--topic", required=True, help="Topic that receives the frames.")
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
    "--topic-option",
    "topic_options",
    multiple=True,
    metavar="KEY=VALUE",
    help="Topic config when the topic is created (e.g. durability=disk).",
)
def serve_cmd(
    uri: str,
    topic: str,
    host: str,
    port: int,
    durable_ack: bool,
    flush_interval_ms: int,
    topic_options: tuple[str, ...],
) -> None:
    """Receive forwarded frames over WebSocket (/write/v4) into TOPIC of the store at URI."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    receiver = Receiver.open(
        uri,
        topic,
        host=host,
        port=port,
        durable_ack=durable_ack,
        flush_interval_ms=flush_interval_ms,
        topic_options=_option_pairs(topic_options),
    )
    # SIGTERM stops like Ctrl-C: a clean stop flushes and writes the de-dup checkpoint.
    signal.signal(signal.SIGTERM, _interrupt)
    receiver.start()
    click.echo(f"listening on ws://{host}:{receiver.port}/write/v4 topic={topic}", nl=True)
    sys.stdout.flush()
    try:
        receiver.serve_forever()
    finally:
        click.echo(json.dumps({"receiver": receiver.stats}), err=True)


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
@click.option("--stdin", "from_stdin", is_flag=True, help="Append each stdin line as a frame.")
@click.option("--until-drained", is_flag=True, help="Exit once everything is acknowledged.")
@click.option("--timeout", type=click.FloatRange(min=0.0), help="Give up after this many s.")
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
    (--from URI --topic NAME) to a receiver. Prints the counters as JSON at exit; a halted
    forwarder exits with status 2 and a one-line sender_error."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if (from_uri is None) != (topic is None):
        raise click.UsageError("--from and --topic go together")
    store = tidelog.open(from_uri) if from_uri is not None else None
    try:
        if store is not None:
            assert topic is not None
            fwd = Forwarder.for_topic(conf, store.topic(topic), subscriber=subscriber, start=start)
        else:
            fwd = Forwarder(conf)
        try:
            _run(fwd, from_stdin, until_drained, timeout)
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
    # CLI turns it into one "tidelog: error: sender_error: ..." line and exit status 2.


def _run(fwd: Forwarder, from_stdin: bool, until_drained: bool, timeout: float | None) -> None:
    if from_stdin:
        for line in sys.stdin.buffer:
            fwd.append(line[:-1] if line.endswith(b"\n") else line)
        fwd.flush()
    stop = threading.Event()
    try:
        if until_drained:
            fwd.wait_acked(timeout=timeout if timeout is not None else 1e9)
        else:
            stop.wait(timeout)
    except KeyboardInterrupt:
        pass
