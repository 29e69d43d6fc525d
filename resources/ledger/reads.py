"""Reads of the ledger: one step row, rows in bulk (the sensor's cold tick reads them all),
the running rows, the change cursor, the audit trail and the provider-call (cost) rows.

``step_run`` rows come back as :class:`LedgerRow` (built here, once); audit and cost rows as
plain dicts.
"""

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from pipeline_defs.resume.partition import Episode, StepKey
from pipeline_defs.resume.status import LedgerRow, StepStatus
from resources.ledger.audit import Transition
from resources.ledger.session import LedgerSession
from resources.ledger.tables import episode_calls, provider_call, step_run, step_transition

# A result row as the mapping it is (SQLAlchemy types RowMapping's keys wider than str).
_Mapping = Mapping[str, Any]
# get_many filters up to this many (project, episode) pairs in SQL, more in Python.
_PAIR_FILTER_LIMIT = 500


def _row(mapping: Mapping[str, Any] | None) -> LedgerRow | None:
    return LedgerRow.from_row(mapping) if mapping is not None else None


class Reads:
    """Read-only operations, each one query in a read transaction of its own."""

    def __init__(self, session: LedgerSession) -> None:
        self.session = session

    def get(self, key: StepKey) -> LedgerRow | None:
        query = sa.select(step_run).where(self.session.key_clause(key))
        return self.session.in_read(
            "read a step row",
            lambda conn: _row(cast(_Mapping, conn.execute(query).mappings().first())),
        )

    def get_many(
        self,
        *,
        episodes: Iterable[Episode] | None = None,
        step_ids: Iterable[str] | None = None,
        changed_since: tuple[int, str] | None = None,
        columns: Sequence[str] | None = None,
    ) -> dict[StepKey, LedgerRow]:
        """All rows (optionally of some episodes/steps) in ONE query, keyed by StepKey.

        With ``changed_since=(transition_seq, updated_at)`` (a :meth:`cursor` value, its
        text moved back by the caller to absorb clock skew) it returns instead every row of
        the partitions touched since then (a row with ``updated_at >=`` that text, or an
        audit row after that seq) plus every row of ``episodes``; still one query, text
        comparison only (never cast). ``columns``: fetch only these (plus the key), for bulk
        readers such as the sensor (a cold tick reads every row of the ledger).
        """
        if columns is None:
            query = sa.select(step_run)
        else:
            names = dict.fromkeys(("project_id", "episode_id", "step_id", *columns))
            query = sa.select(*(step_run.c[name] for name in names))
        if step_ids is not None:
            query = query.where(step_run.c.step_id.in_(list(step_ids)))
        pair = sa.tuple_(step_run.c.project_id, step_run.c.episode_id)
        listed = sorted({(e.project_id, e.episode_id) for e in episodes or ()})
        wanted: set[tuple[str, str]] | None = None
        if changed_since is not None:
            seq, since = changed_since
            touched = sa.union(
                sa.select(step_run.c.project_id, step_run.c.episode_id).where(
                    step_run.c.updated_at >= since
                ),
                sa.select(step_transition.c.project_id, step_transition.c.episode_id).where(
                    step_transition.c.transition_seq > seq
                ),
            ).subquery()
            clause = pair.in_(sa.select(touched.c.project_id, touched.c.episode_id))
            query = query.where(sa.or_(clause, pair.in_(listed)) if listed else clause)
        elif episodes is not None:
            wanted = set(listed)
            if len(listed) <= _PAIR_FILTER_LIMIT:
                query = query.where(pair.in_(listed))
            else:
                projects = sorted({p for p, _ in wanted})
                query = query.where(step_run.c.project_id.in_(projects))

        def fetch(conn: Connection) -> tuple[list[str], list[Sequence[Any]]]:
            result = conn.execute(query)
            return list(result.keys()), list(result.all())

        labels, fetched = self.session.in_read("read step rows", fetch)
        # Per row (a cold sensor tick reads every row of the ledger): no dict, no defaults
        # copy, no frozen __init__ (LedgerRow.builder, StepKey.of: the same rows and keys).
        build = LedgerRow.builder(labels)
        project, episode, step = (labels.index(c) for c in ("project_id", "episode_id", "step_id"))
        key_of = StepKey.of
        out: dict[StepKey, LedgerRow] = {}
        for values in fetched:
            if wanted is not None and (values[project], values[episode]) not in wanted:
                continue
            out[key_of(values[project], values[episode], values[step])] = build(values)
        return out

    def running_rows(self) -> list[LedgerRow]:
        query = sa.select(step_run).where(step_run.c.status == StepStatus.RUNNING.value)
        return self.session.in_read(
            "read running rows",
            lambda conn: [
                LedgerRow.from_row(cast(_Mapping, r)) for r in conn.execute(query).mappings()
            ],
        )

    def cursor(self) -> tuple[int, str]:
        """(highest transition_seq, latest updated_at): changes when any row or audit changes."""

        def read(conn: Connection) -> tuple[int, str]:
            seq = conn.execute(sa.select(sa.func.max(step_transition.c.transition_seq))).scalar()
            updated = conn.execute(sa.select(sa.func.max(step_run.c.updated_at))).scalar()
            return int(seq or 0), str(updated or "")

        return self.session.in_read("read the ledger cursor", read)

    def transitions(self, key: StepKey | None = None, *, since_seq: int = 0) -> list[Transition]:
        query = sa.select(step_transition).where(step_transition.c.transition_seq > since_seq)
        if key is not None:
            query = query.where(
                step_transition.c.project_id == key.project_id,
                step_transition.c.episode_id == key.episode_id,
                step_transition.c.step_id == key.step_id,
            )
        ordered = query.order_by(step_transition.c.transition_seq)
        return self.session.in_read(
            "read transitions",
            lambda conn: [
                Transition.from_row(cast(_Mapping, r)) for r in conn.execute(ordered).mappings()
            ],
        )

    def episode_calls(self, project_id: str, episode_id: str) -> int:
        """How many provider calls the episode has recorded (sent, answered or not): its
        ``episode_calls`` count, the one the spend cap is checked against."""
        query = sa.select(episode_calls.c.calls).where(
            episode_calls.c.project_id == project_id,
            episode_calls.c.episode_id == episode_id,
        )
        return int(
            self.session.in_read("count provider calls", lambda conn: conn.execute(query).scalar())
            or 0
        )

    def provider_calls(
        self,
        key: StepKey | None = None,
        *,
        run_id: str | None = None,
        episode: Episode | None = None,
    ) -> list[dict[str, Any]]:
        query = sa.select(provider_call)
        if key is not None:
            episode = key.episode
            query = query.where(provider_call.c.step_id == key.step_id)
        if episode is not None:
            query = query.where(
                provider_call.c.project_id == episode.project_id,
                provider_call.c.episode_id == episode.episode_id,
            )
        if run_id is not None:
            query = query.where(provider_call.c.run_id == run_id)
        ordered = query.order_by(provider_call.c.id)
        return self.session.in_read(
            "read provider calls", lambda conn: [dict(r) for r in conn.execute(ordered).mappings()]
        )
