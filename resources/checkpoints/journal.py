"""The journal of paid replies (docs/DESIGN.md#reply-journal).

A provider reply is made durable in the store every machine shares (the bucket, or the
home on one disk) the moment it arrives, before the step uses it, under
``journal/<project>/<episode>/<step>/<lineage>/<request>.<n>``:

- ``lineage``: the step row's journal lineage (``step_run.journal_lineage``), kept by a claim
  that goes on with the same work (a dead owner's recovery, a retry) and new at one that
  starts new work (after a publish, a force, a redraw, a reply the step refused);
- ``request``: the sha256 of the request's identity (the step, the kind of model, the model
  asked and the whole call: prompt, payload, size, seed), ``n`` its occurrence in the run
  (the n-th time the step asks this very request).

One object per reply: a header line (JSON: the request, its occurrence, the payload's
sha256 and size, the model that answered, its units, when, and the claim and provider call
that paid for it) and the payload's bytes. A later claim of the same lineage, on any
machine, takes back an entry whose header names its request exactly and whose bytes match
the header; anything else (another request, bytes changed or cut short, an unreadable
header) is never taken back, and is reported. Entries are written create-only: nothing is
ever overwritten. ``storyboard gc`` deletes the entries of lineages no row holds any more.
"""

import dataclasses
import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from pipeline_defs.resume.errors import PipelineError, StorageObjectExists, StorageObjectMissing
from pipeline_defs.resume.partition import StepKey
from resources.storage import Storage

JOURNAL = "journal"
FORMAT = 1
_MAX_HEADER = 64 * 1024


def request_digest(step_id: str, kind: str, model: str | None, call: object) -> str:
    """The sha256 naming one request: the step, the kind of model, the model asked and
    every field of the call (but an unset one: a field added later names no new request).
    Another prompt, model, size or seed is another request."""
    fields = dataclasses.asdict(call) if dataclasses.is_dataclass(call) else call  # type: ignore[arg-type]
    if isinstance(fields, dict):
        fields = {name: value for name, value in fields.items() if value is not None}
    body = {"step": step_id, "kind": kind, "model": model, "call": fields}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=repr)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def journal_prefix(key: StepKey, lineage: str | None = None) -> str:
    """The journal's prefix of a step (and of one of its lineages), a storage prefix:
    matched per path segment."""
    base = f"{JOURNAL}/{key.project_id}/{key.episode_id}/{key.step_id}"
    return base if lineage is None else f"{base}/{lineage}"


@dataclass(frozen=True)
class KeptReply:
    """A reply as the journal keeps it: its bytes, and what the ledger records of it."""

    payload: bytes
    units: int
    model: str


@dataclass(frozen=True)
class JournalEntry:
    """One listed entry: where it is, and the step and lineage it belongs to."""

    object_key: str
    key: StepKey
    lineage: str


def parse_entry_key(object_key: str) -> JournalEntry | None:
    """The step and lineage of ``journal/<p>/<e>/<step>/<lineage>/<name>`` (None: not one)."""
    parts = object_key.split("/")
    if len(parts) != 6 or parts[0] != JOURNAL:
        return None
    return JournalEntry(object_key, StepKey(parts[1], parts[2], parts[3]), parts[4])


def _problem(header: Any, payload: bytes, request: str, occurrence: int) -> str | None:
    """What makes an entry unfit to take back for (request, occurrence); None: fit."""
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        return "its header is not a journal entry's"
    if header.get("request") != request or header.get("occurrence") != occurrence:
        return "its header names another request"
    if header.get("size") != len(payload):
        return f"it holds {len(payload)} bytes, its receipt says {header.get('size')!r}"
    if header.get("sha256") != hashlib.sha256(payload).hexdigest():
        return "its bytes do not match its receipt's sha256"
    units, model = header.get("units"), header.get("model")
    if not isinstance(units, int) or isinstance(units, bool) or not isinstance(model, str):
        return "its receipt names no units or model"
    return None


@dataclass
class ReplyJournal:
    """The entries of one step's lineage, for one claimed run."""

    storage: Storage
    key: StepKey
    lineage: str
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("storyboard"))
    # Entries found unfit and left alone (``storage key: why``), for the run's report.
    rejected: list[str] = field(default_factory=list)
    _listed: set[str] | None = None

    @property
    def prefix(self) -> str:
        return journal_prefix(self.key, self.lineage)

    def entry_key(self, request: str, occurrence: int) -> str:
        return f"{self.prefix}/{request}.{occurrence}"

    def _names(self) -> set[str]:
        # One LIST per run and step: a first run (nothing kept) pays no GET per call.
        if self._listed is None:
            self._listed = {meta.key for meta in self.storage.list(self.prefix)}
        return self._listed

    def take(self, request: str, occurrence: int) -> KeptReply | None:
        """The reply kept for (request, occurrence), verified; None: none fit to take."""
        object_key = self.entry_key(request, occurrence)
        if object_key not in self._names():
            return None
        try:
            data = self.storage.get(object_key)
        except StorageObjectMissing:  # collected since the listing
            return None
        head, sep, payload = data.partition(b"\n")
        try:
            header = json.loads(head) if sep and len(head) <= _MAX_HEADER else None
        except ValueError:
            header = None
        problem = _problem(header, payload, request, occurrence)
        if problem is not None:
            where = f"{self.storage.url}/{object_key}"
            self.rejected.append(f"{where}: {problem}")
            self.log.warning(
                "%s: the journal entry %s is not taken back (%s); the reply is paid for again",
                self.key,
                where,
                problem,
            )
            return None
        assert isinstance(header, dict)
        return KeptReply(payload, int(header["units"]), str(header["model"]))

    def keep(
        self, request: str, occurrence: int, reply: KeptReply, *, claim: str, call_id: int
    ) -> bool:
        """Make a reply durable before it is used (one create-only put). False when it
        could not be kept: the step goes on with it (it is paid for), and says so."""
        header = {
            "format": FORMAT,
            "request": request,
            "occurrence": occurrence,
            "sha256": hashlib.sha256(reply.payload).hexdigest(),
            "size": len(reply.payload),
            "model": reply.model,
            "units": reply.units,
            "claim": claim,
            "call_id": call_id,
            "paid_at": datetime.now(UTC).isoformat(timespec="milliseconds"),
        }
        data = json.dumps(header, sort_keys=True).encode("utf-8") + b"\n" + reply.payload
        object_key = self.entry_key(request, occurrence)
        try:
            self.storage.put_create(object_key, data)
        except StorageObjectExists:
            # Another delivery of this lineage kept it first: its bytes stay.
            return True
        except PipelineError as exc:
            self.log.warning(
                "%s: a paid reply could not be kept in the journal (%s); the step goes on "
                "with it, a later attempt would pay for it again",
                self.key,
                exc,
            )
            return False
        if self._listed is not None:
            self._listed.add(object_key)
        return True


def journal_entries(storage: Storage) -> Iterator[tuple[JournalEntry, Any]]:
    """Every entry of the journal with its listing (``ObjectMeta``), listed before any row
    is read (the collection's rule)."""
    for meta in storage.list(JOURNAL):
        entry = parse_entry_key(meta.key)
        if entry is not None:
            yield entry, meta


# The statuses whose row's next claim may go on with its work (and take its replies back).
HOLDING = frozenset({"running", "failed", "pending"})


def lineages_in_use(rows: Iterable[tuple[StepKey, str, str | None]]) -> set[tuple[StepKey, str]]:
    """The (step, lineage) pairs a claim may still take back: a row whose work is not over
    (running, failed, pending) holds its lineage; a finished row's next claim starts anew."""
    return {(key, lineage) for key, status, lineage in rows if lineage and status in HOLDING}


@dataclass(frozen=True)
class JournalCollection:
    """What :func:`collect_journal` did (or, dry, would do)."""

    deleted_entries: int
    kept_in_use: int
    kept_young: int


def collect_journal(
    storage: Storage,
    in_use: Callable[[], set[tuple[StepKey, str]]],
    *,
    now: datetime,
    grace: timedelta,
    dry_run: bool = False,
) -> JournalCollection:
    """Delete the entries of lineages no row holds any more, once older than ``grace``.

    The journal is listed first, the rows (``in_use``) read after, right before deleting:
    an entry kept by a claim that started while the listing ran belongs to a lineage its row
    names by then. An entry whose age the store does not report counts as young; an object
    under ``journal/`` that is no entry is left alone."""
    listed = list(journal_entries(storage))
    using = in_use()
    deleted = kept_in_use = kept_young = 0
    for entry, meta in listed:
        if (entry.key, entry.lineage) in using:
            kept_in_use += 1
            continue
        if meta.last_modified is None or meta.last_modified > now - grace:
            kept_young += 1
            continue
        if not dry_run:
            storage.delete(entry.object_key)
        deleted += 1
    return JournalCollection(deleted, kept_in_use, kept_young)
