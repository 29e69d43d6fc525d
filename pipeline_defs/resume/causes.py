"""The root cause of a failure, as one typed line an operator can act on.

Dagster describes an exception raised by an op as its own wrapper ("Error occurred while
executing op ...") with the cause in a stack trace below; the CLI printed just that. These
helpers find the cause instead: a ``PipelineError`` as it is, a fault of the storage (a
full disk, a read-only file system or database, a permission) by a ``storage.*`` code and
the path, anything else as ``internal`` with its own type and message. No Dagster here:
used by the asset wiring, the CLI and the run-failure reader alike.
"""

import errno
import re
from collections.abc import Iterator

from pipeline_defs.resume.errors import ErrorCode, PipelineError

# A fault of the storage under the data root or the ledger: no re-run or force can fix it, an
# operator must (free space, remount read-write, fix permissions).
# errno -> (code, what happened, how it names the path).
STORAGE_ERRNOS: dict[int, tuple[ErrorCode, str, str]] = {
    errno.ENOSPC: (ErrorCode.STORAGE_FULL, "no space left on device", "writing"),
    errno.EDQUOT: (ErrorCode.STORAGE_FULL, "disk quota exceeded", "writing"),
    errno.EROFS: (ErrorCode.STORAGE_READ_ONLY, "read-only file system", "writing"),
    errno.EACCES: (ErrorCode.STORAGE_PERMISSION_DENIED, "permission denied", "on"),
    errno.EPERM: (ErrorCode.STORAGE_PERMISSION_DENIED, "operation not permitted", "on"),
}
# The same faults as the ledger's drivers word them: (code, marker, wording). SQLite says
# "database or disk is full" / "attempt to write a readonly database"; PostgreSQL "could not
# extend file ...: No space left on device" / "cannot execute ... in a read-only transaction".
STORAGE_DB_MARKERS: tuple[tuple[ErrorCode, str, str], ...] = (
    (ErrorCode.STORAGE_FULL, "database or disk is full", "the ledger database is full"),
    (ErrorCode.STORAGE_FULL, "no space left on device", "the ledger database is full"),
    (ErrorCode.STORAGE_READ_ONLY, "readonly database", "the ledger database is read-only"),
    (ErrorCode.STORAGE_READ_ONLY, "read-only transaction", "the ledger database is read-only"),
)
DB_MODULES = frozenset({"sqlite3", "sqlalchemy", "psycopg", "psycopg2"})
# PostgreSQL gone or restarting, as libpq and the server word it. The ledger store retries
# these (resources.ledger.retry) and past its budget raises ``ledger.unavailable`` itself;
# these markers type the same fault when it reaches us some other way (a raw engine use, a
# failure known only as text), so that it never reads as ``[internal] OperationalError``.
LEDGER_DOWN_MARKERS = (
    "terminating connection due to administrator command",
    "server closed the connection unexpectedly",
    "the database system is starting up",
    "the database system is shutting down",
    "the database system is in recovery mode",
    "connection to server at",  # libpq: connection to server at "h", port p failed: ...
    "connection to server on socket",
)
# ... unless the text says the server answered and refused us for good.
LEDGER_PERMANENT_MARKERS = (
    "does not exist",
    "authentication failed",
    "password",
    "no pg_hba.conf entry",
    "permission denied",
    "could not translate host name",
    "invalid",
)
_ERRNO_TEXT = re.compile(r"\[Errno (\d+)\]")


def one_line(text: object, limit: int = 1000) -> str:
    """Whitespace collapsed: a failure description is read as one line."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def exception_chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then what it was raised from or while handling (cycle-safe).

    A failure while recording a failure (the ledger write after a full disk) carries the
    first one as ``__context__``: both are looked at for the cause.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or (
            None if current.__suppress_context__ else current.__context__
        )


def _paths(error: OSError) -> str:
    names = [repr(str(n)) for n in (error.filename, error.filename2) if n is not None]
    # The stores' writers name the file of a write through a descriptor (store._naming).
    return " -> ".join(names) or "(the file is not named)"


def storage_fault(exc: BaseException, *, ledger: str | None = None) -> PipelineError | None:
    """The typed storage fault behind ``exc`` (anywhere in its chain), or None.

    ``ledger``: how to name the ledger database (a URL without password) in the message.
    """
    for item in exception_chain(exc):
        if isinstance(item, OSError) and item.errno in STORAGE_ERRNOS:
            code, what, verb = STORAGE_ERRNOS[item.errno]
            return PipelineError(
                code,
                f"{what} {verb} {_paths(item)} ({errno.errorcode[item.errno]})",
                details={"path": str(item.filename)} if item.filename else None,
            )
        if type(item).__module__.split(".")[0] in DB_MODULES:
            driver = getattr(item, "orig", None) or item  # sqlalchemy wraps the driver's error
            text = one_line(str(driver).split("\n", 1)[0], 300)  # not the SQL that follows
            for code, marker, wording in STORAGE_DB_MARKERS:
                if marker in text.lower():
                    where = f" ({ledger})" if ledger else ""
                    return PipelineError(code, f"{wording}{where}: {text}")
    return None


def ledger_down(text: str) -> bool:
    """Whether a database error's text says the PostgreSQL ledger is down or restarting."""
    lowered = text.lower()
    return any(m in lowered for m in LEDGER_DOWN_MARKERS) and not any(
        m in lowered for m in LEDGER_PERMANENT_MARKERS
    )


def _ledger_outage(exc: BaseException, ledger: str | None) -> PipelineError | None:
    for item in exception_chain(exc):
        if type(item).__module__.split(".")[0] in DB_MODULES:
            driver = getattr(item, "orig", None) or item
            text = one_line(str(driver).split("\n", 1)[0], 300)
            if ledger_down(text):
                where = f" ({ledger})" if ledger else ""
                return PipelineError(
                    ErrorCode.LEDGER_UNAVAILABLE,
                    f"the ledger database{where} is unreachable: {text}",
                )
    return None


def root_cause(exc: BaseException, *, ledger: str | None = None) -> PipelineError:
    """One typed error naming what went wrong: a PipelineError as it is, a storage fault by
    its code, a PostgreSQL ledger that is down as ``ledger.unavailable``, anything else as
    ``internal`` with its own type and message."""
    if isinstance(exc, PipelineError):
        return exc
    fault = storage_fault(exc, ledger=ledger) or _ledger_outage(exc, ledger)
    if fault is not None:
        return fault
    return PipelineError(
        ErrorCode.INTERNAL,
        one_line(f"{type(exc).__name__}: {exc}"),
        details={"type": type(exc).__name__},
    )


def root_cause_of_text(text: str) -> PipelineError:
    """The same, for a failure known only as text (``OverflowError: ...`` from an event log)."""
    flat = one_line(text)
    found = _ERRNO_TEXT.search(flat)
    if found is not None and int(found.group(1)) in STORAGE_ERRNOS:
        code, what, _verb = STORAGE_ERRNOS[int(found.group(1))]
        return PipelineError(code, f"{what}: {flat}")
    for code, marker, wording in STORAGE_DB_MARKERS:
        if marker in flat.lower():
            return PipelineError(code, f"{wording}: {flat}")
    if ledger_down(flat):
        return PipelineError(
            ErrorCode.LEDGER_UNAVAILABLE, f"the ledger database is unreachable: {flat}"
        )
    return PipelineError(ErrorCode.INTERNAL, flat)
