"""The ``tidelog`` command group and what every command shares: exit statuses (CLI-1), the one
stderr error line (CLI-2), SIGTERM as an interrupt.

``tidelog.cli`` adds the core commands to ``main``; each optional area adds its own from its
module (tidelog/cli_<area>.py), which imports this one, never ``tidelog.cli`` (no import cycle).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

import click

import tidelog
from tidelog import _cli_format as fmt
from tidelog.errors import TidelogError

__all__ = [
    "main",
    "EXIT_OK",
    "EXIT_FAILED",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "fail",
    "sigterm_as_interrupt",
]

EXIT_OK = 0
EXIT_FAILED = 1  # done, and the answer is bad: damage found, records lost, not drained (CLI-1)
EXIT_ERROR = 2  # refused or failed: a TidelogError, an OS error, a usage error
EXIT_INTERRUPTED = 130  # Ctrl-C where it is not the normal end of the command


def fail(code: str, message: str) -> None:
    """Print one error line on stderr (CLI-2): ``tidelog: error: CODE: MESSAGE``."""
    text = fmt.escape(" ".join(message.split()))  # one line, whatever the backend wrote
    click.echo(f"tidelog: error: {code}: {text}", err=True)


class _Group(click.Group):
    """Turns every error into one stderr line with its code, never a traceback (CLI-1, CLI-2)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except TidelogError as exc:
            fail(exc.code, str(exc.message))
            ctx.exit(EXIT_ERROR)
        except BrokenPipeError:
            # The reader went away (`tidelog tail ... | head`): not an error. Later writes
            # (the interpreter's final flush) go nowhere instead of failing again.
            devnull = os.open(os.devnull, os.O_WRONLY)
            with contextlib.suppress(OSError, ValueError):
                os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
            ctx.exit(EXIT_OK)
        except OSError as exc:  # outside the library (a socket, stdin): still typed (ERR-1)
            fail("io_error", str(exc))
            ctx.exit(EXIT_ERROR)
        except KeyboardInterrupt:
            click.echo("tidelog: interrupted", err=True)
            ctx.exit(EXIT_INTERRUPTED)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM ends the block like Ctrl-C (KeyboardInterrupt), for commands that run until
    stopped; the previous handler comes back after it. A no-op off the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@click.group("tidelog", cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(tidelog.__version__, prog_name="tidelog")
def main() -> None:
    """tidelog: a durable, sequence-numbered store-and-forward log.

    URIs: memory:// (fresh, in-process), memory://NAME (named, in-process), model:// (the
    reference model), file://DIR (WAL + segments), blockdev://PATH (flash page ring on a device
    or image), sf://SF_DIR/SENDER_ID (a store-and-forward slot); see the README.

    Exit status: 0 done; 1 done but the answer is bad (verify found damage, a demo lost
    records, forward did not drain); 2 an error, printed on stderr as one line
    "tidelog: error: CODE: MESSAGE"; 130 interrupted.
    """
