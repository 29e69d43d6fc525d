"""The wiring every command shares: ``--json``, a typed error as one line on stderr and
exit code 1, a reader that went away (``storyboard status | head``) ended quietly."""

import functools
import os
import signal
import sys
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import click

from pipeline_defs.cli.render import emit_json
from pipeline_defs.resume.causes import root_cause
from pipeline_defs.resume.errors import InternalError, PipelineError

F = TypeVar("F", bound=Callable[..., Any])
DEBUG_ENV = "STORYBOARD_DEBUG"


class CommandFailed(Exception):
    """A command ran but its outcome is a failure (e.g. a run failed): exit 1."""

    def __init__(self, error: PipelineError) -> None:
        super().__init__(str(error))
        self.error = error


def error_payload(error: PipelineError) -> dict[str, Any]:
    return {
        "code": error.code,
        "message": error.message,
        "status": error.status,
        "origin": error.origin,
    }


def operation(name: str) -> Callable[[F], F]:
    """Common wiring: ``--json``, typed errors → one line on stderr and exit code 1."""

    def wrap(fn: F) -> F:
        @click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
        @functools.wraps(fn)
        def run(*args: Any, as_json: bool, **kwargs: Any) -> None:
            try:
                payload = fn(*args, as_json=as_json, **kwargs)
                if as_json and payload is not None:
                    emit_json({"ok": True, "command": name, **payload})
            except CommandFailed as failed:
                click.echo(f"error: {failed.error}", err=True)
                sys.exit(1)
            except PipelineError as error:
                if as_json:
                    emit_json({"ok": False, "command": name, "error": error_payload(error)})
                click.echo(f"error: {error}", err=True)
                sys.exit(1)
            except (click.ClickException, click.exceptions.Exit, click.Abort, SystemExit):
                raise
            except Exception as exc:
                if _reader_went_away(exc):
                    _exit_quietly_on_closed_pipe()
                if os.environ.get(DEBUG_ENV):
                    raise
                # A full disk or a read-only home is named as such (typed), anything else
                # keeps its type and message: never a bare "OSError: [Errno 30]".
                cause = root_cause(exc)
                if as_json:
                    emit_json({"ok": False, "command": name, "error": error_payload(cause)})
                hint = (
                    f" (set {DEBUG_ENV}=1 for a traceback)"
                    if isinstance(cause, InternalError)
                    else ""
                )
                click.echo(f"error: {cause}{hint}", err=True)
                sys.exit(1)

        return run  # type: ignore[return-value]

    return wrap


def _reader_went_away(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) is a write to a pipe nobody reads any more."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, BrokenPipeError):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def _exit_quietly_on_closed_pipe() -> NoReturn:
    """``storyboard status | head``: the reader has what it wanted; that is a normal end.

    As ``git log | head`` does: no message (there is nobody to tell, and an ``[internal]``
    line would send an operator hunting for a fault that is not there) and the exit status
    of a process SIGPIPE ended (128 + 13), so a ``pipefail`` script still knows the output
    was cut. stdout and stderr are pointed at /dev/null first, or the interpreter's last
    flush of the dead pipe would raise again on the way out.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):  # no real descriptor (a test runner)
            pass
    sys.exit(128 + signal.SIGPIPE)
