"""What a step body and its verifier see: its key, config, files and metered providers.

Two types: :class:`VerifyContext`, what a verifier (and ``is_applicable``, ``verify_reads``)
gets from the read-only judge, holds the stores' readers only (``steps.readers``) and has no
method that writes; :class:`StepContext` extends it with the full stores, the owner's
metered providers, ``write_artifact`` and ``fenced``, for ``execute`` inside a claimed run.
"""

import logging
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from pipeline_defs.project import ProjectConfig
from pipeline_defs.resume.budget import CallCap
from pipeline_defs.resume.errors import BudgetExhausted, ErrorCode, PipelineError
from pipeline_defs.resume.money import MoneyBudget, Reservation
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.resume.settings import REPLIED_STAGE
from pipeline_defs.steps.faults import crash_point
from pipeline_defs.steps.metered_money import price_call
from pipeline_defs.steps.readers import CheckpointReader, LedgerReader
from resources.checkpoints.envelope import Artifact, Checkpoint
from resources.checkpoints.journal import KeptReply, ReplyJournal, request_digest
from resources.checkpoints.store import CheckpointStore
from resources.ledger.store import LedgerStore
from resources.providers import ImageCall, ImageReply, TextCall, TextReply
from resources.providers.base import IMAGE, TEXT, Model, ModelKind, Reply
from resources.providers.throttle import Throttle, throttled

C = TypeVar("C")
R = TypeVar("R", bound=Reply)
T = TypeVar("T")


def _name(model: Model) -> str | None:
    """A model's configured name, if it has one (a test's fake may not)."""
    try:
        return model.model_name
    except NotImplementedError:
        return None


@dataclass
class ProviderMeter:
    """The one place every model call goes through, recorded in the cost ledger before it is
    sent and finished with its reply: a worker killed during a call leaves it unfinished
    ("unknown outcome" in ``storyboard status``), never unrecorded."""

    ledger: LedgerStore
    key: StepKey
    run_id: str | None
    # The models of the project, by kind name (``MODEL_KINDS``); a kind absent: not configured.
    models: Mapping[str, Model]
    # Calls sent, by kind name.
    sent: Counter[str] = field(default_factory=Counter)
    # Models that answered, in order of first answer: the step's ``resolved_model``.
    answered_by: list[str] = field(default_factory=list)
    # Raises when the owner may no longer spend (its lease was lost): checked before every
    # call, so a worker whose row was taken over makes no further paid call.
    guard: Callable[[], None] | None = None
    # The episode's spend cap (docs/DESIGN.md#spend-cap): a call that would take the
    # episode's recorded calls past it is refused before it is sent, ``budget.exhausted``.
    cap: CallCap | None = None
    # ``run_id`` is the fencing token of the claim the calls are made under: each call is
    # recorded only while that claim holds the row (docs/DESIGN.md#claim-tokens).
    claimed: bool = False
    # The journal of paid replies of the claim's lineage (docs/DESIGN.md#reply-journal):
    # each reply is kept there the moment it arrives, before the step uses it, and a
    # request the lineage paid for already is taken back from it instead of sent.
    journal: ReplyJournal | None = None
    # Replies taken back from the journal (no call sent), by kind name.
    taken: Counter[str] = field(default_factory=Counter)
    # How often this run asked each request (its digest): the n-th ask takes the n-th reply.
    asked: Counter[str] = field(default_factory=Counter)
    # The shared rate limit the calls wait for (docs/DESIGN.md#rate-limit); None: none.
    throttle: Throttle | None = None

    # The project's prices and money budgets (docs/DESIGN.md#money-budgets): each call's
    # worst case is reserved with it, and settled to its reported usage after.
    money: MoneyBudget | None = None

    def _start(self, kind: str, reservation: Reservation | None = None) -> int:
        """Record the call about to be sent, within the cap and the money budgets (reserved
        in the ledger)."""
        limit = None if self.cap is None else self.cap.limit
        try:
            return self.ledger.start_provider_call(
                self.key,
                self.run_id,
                kind=kind,
                cap=limit,
                claimed=self.claimed,
                reservation=reservation,
            )
        except BudgetExhausted as exc:
            if "budget" in exc.details and self.money is not None:  # a money budget's
                raise self.money.refusal(str(self.key), exc.details) from None
            if self.cap is None:
                raise
            spent = int(exc.details.get("spent", limit or 0))
            raise self.cap.refusal(
                self.key.project_id, self.key.episode_id, spent, step=str(self.key)
            ) from None

    def ask(self, kind: ModelKind[C, R], call: C) -> R:
        """One call to the project's model of ``kind``, metered."""
        if self.guard is not None:
            self.guard()
        model = self.models.get(kind.name)
        if model is None:
            raise PipelineError(
                ErrorCode.PROVIDER_CONFIG, f"{self.key}: no {kind.name} model configured"
            )
        request = request_digest(self.key.step_id, kind.name, _name(model), call)
        self.asked[request] += 1
        occurrence = self.asked[request]
        if self.journal is not None:
            kept = self.journal.take(request, occurrence)
            if kept is not None:  # paid for by an earlier attempt of this work
                self.taken[kind.name] += 1
                return self._answered(kind.revive(kept.payload, kept.units, kept.model))
        priced = price_call(self.money, kind.name, _name(model), call, step=str(self.key))
        call_id = self._start(kind.name, priced.reservation)
        self.sent[kind.name] += 1
        try:
            with throttled(self.throttle):
                reply = kind.ask(model, priced.call)
        except BaseException:  # failed, answered: still names the model asked; the call
            # keeps its reservation (its cost unknown: the worst case stands)
            self.ledger.finish_provider_call(call_id, units=0, model=_name(model))
            raise
        if self.journal is not None and self.run_id is not None:
            kept = KeptReply(kind.keep(reply), reply.units, reply.model)
            self.journal.keep(request, occurrence, kept, claim=self.run_id, call_id=call_id)
        usage = getattr(reply, "usage", None)  # a kind's reply may report none
        self.ledger.finish_provider_call(
            call_id,
            units=reply.units,
            model=reply.model,
            usage=usage,
            cost_micros=priced.cost(usage),
            reserved_micros=priced.reserved,
        )
        crash_point(f"{REPLIED_STAGE}{self.calls}", self.key.step_id)
        return self._answered(reply)

    def _answered(self, reply: R) -> R:
        if reply.model and reply.model not in self.answered_by:
            self.answered_by.append(reply.model)
        return reply

    def text(self, call: TextCall) -> TextReply:
        return self.ask(TEXT, call)

    def image(self, call: ImageCall) -> ImageReply:
        return self.ask(IMAGE, call)

    @property
    def image_model_name(self) -> str | None:
        """The image model this run draws with (None for a fake that names none)."""
        model = self.models.get(IMAGE.name)
        return None if model is None else _name(model)

    @property
    def resolved_model(self) -> str | None:
        """The model(s) that produced this run's results; None when nothing was called."""
        return ", ".join(self.answered_by) or None

    @property
    def calls(self) -> int:
        return sum(self.sent.values())


@dataclass
class VerifyContext:
    """What a verifier sees: its key, config and files, through the stores' readers.

    Dagster-free, so verifiers are testable on plain files. No provider, no writer: a
    verifier (and ``is_applicable``, ``verify_reads``) only reads, by type.
    """

    key: StepKey
    project: ProjectConfig
    checkpoints: CheckpointReader
    ledger: LedgerReader
    # The owner verifying: None for a judge (entry), the run's token at its exit verify.
    run_id: str | None = None
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("storyboard"))

    @property
    def home(self) -> Path:
        return self.checkpoints.home

    @property
    def step_dir(self) -> Path:
        return self.checkpoints.step_dir(self.key)

    @property
    def episode_dir(self) -> Path:
        """Inputs of this episode: ``projects/<p>/episodes/<e>/``."""
        return Path(self.checkpoints.layout.episode_dir(self.key.project_id, self.key.episode_id))

    def upstream(self, step_id: str) -> Checkpoint | None:
        return self.checkpoints.load(StepKey(self.key.project_id, self.key.episode_id, step_id))

    def artifact_path(self, relative: str) -> Path:
        return self.checkpoints.artifact_path(self.key, relative)


@dataclass
class StepContext(VerifyContext):
    """A claimed run's context: the verifier's, plus the full stores, the metered providers
    and the writes (``write_artifact``, ``fenced``) a step body makes."""

    checkpoints: CheckpointStore
    ledger: LedgerStore
    meter: ProviderMeter | None = None
    # Items this run was asked to draw again although valid (tag resume/redraw).
    redraw: frozenset[str] = frozenset()

    @classmethod
    def owned(
        cls,
        read: VerifyContext,
        *,
        checkpoints: CheckpointStore,
        ledger: LedgerStore,
        run_id: str,
        meter: ProviderMeter | None = None,
        redraw: frozenset[str] = frozenset(),
    ) -> "StepContext":
        """The judge's context ``read``, owned by run ``run_id`` on the writing stores."""
        return cls(
            key=read.key,
            project=read.project,
            checkpoints=checkpoints,
            ledger=ledger,
            run_id=run_id,
            log=read.log,
            meter=meter,
            redraw=redraw,
        )

    def write_artifact(self, relative: str, payload: bytes) -> Artifact:
        return self.checkpoints.write_artifact(self.key, relative, payload)

    def fenced(self, write: Callable[[], T]) -> T:
        """Make a file visible only while this run still owns the step: under
        the ledger row lock, so a worker whose lease was taken over can neither replace nor
        archive what the new owner published (``step.ownership_lost`` instead). Outside a
        claimed run (no owner) the write simply happens."""
        if self.run_id is None:
            return write()
        return self.ledger.publish(self.key, self.run_id, write)

    @property
    def providers(self) -> ProviderMeter:
        if self.meter is None:
            raise PipelineError(
                ErrorCode.STEP_PROVIDER_OUTSIDE_RUN,
                f"{self.key}: providers are only available inside a claimed run",
            )
        return self.meter
