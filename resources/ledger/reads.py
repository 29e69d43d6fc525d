"""Reads of the ledger: one step row, rows in bulk (the sensor's cold tick reads them all),
the running rows, the change cursor, the audit trail and the provider-call (cost) rows.

``step_run`` rows come back as :class:`LedgerRow` (built here, once); audit and cost rows as
plain dicts.
"""

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, cast

from sqlalchemy.engine import Connection

from pipeline_defs.resume.partition import Episode, StepKey
from pipeline_defs.resume.status import LedgerRow
from resources.ledger import cost_statements, history_statements, statements
from resources.ledger.audit import Transition
from resources.ledger.session import LedgerSession

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
        query = statements.step_row(key)
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
        listed = sorted({(e.project_id, e.episode_id) for e in episodes or ()})
        wanted: set[tuple[str, str]] | None = None
        by: Literal["pairs", "projects", "all"] = "all"
        if changed_since is None and episodes is not None:
            wanted = set(listed)
            by = "pairs" if len(listed) <= _PAIR_FILTER_LIMIT else "projects"
        query = statements.step_rows(
            columns=columns,
            step_ids=step_ids,
            episodes=listed,
            changed_since=changed_since,
            by=by,
        )

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
        query = statements.running_rows()
        return self.session.in_read(
            "read running rows",
            lambda conn: [
                LedgerRow.from_row(cast(_Mapping, r)) for r in conn.execute(query).mappings()
            ],
        )

    def cursor(self) -> tuple[int, str]:
        """(highest transition_seq, latest updated_at): changes when any row or audit changes."""

        def read(conn: Connection) -> tuple[int, str]:
            seq = conn.execute(history_statements.newest_transition_seq()).scalar()
            updated = conn.execute(statements.newest_update()).scalar()
            return int(seq or 0), str(updated or "")

        return self.session.in_read("read the ledger cursor", read)

    def transitions(
        self,
        key: StepKey | None = None,
        *,
        since_seq: int = 0,
        episodes: Iterable[Episode] | None = None,
    ) -> list[Transition]:
        """History lines (of one step, of ``episodes``, or all), in commit order."""
        ordered = history_statements.history(key, since_seq=since_seq, episodes=_pairs(episodes))
        return self.session.in_read(
            "read transitions",
            lambda conn: [
                Transition.from_row(cast(_Mapping, r)) for r in conn.execute(ordered).mappings()
            ],
        )

    def episode_calls(self, project_id: str, episode_id: str) -> int:
        """How many provider calls the episode has recorded (sent, answered or not): its
        ``episode_calls`` count, the one the spend cap is checked against."""
        query = cost_statements.episode_call_count(project_id, episode_id)
        return int(
            self.session.in_read("count provider calls", lambda conn: conn.execute(query).scalar())
            or 0
        )

    def episode_estimate(self, project_id: str, episode_id: str) -> int | None:
        """The calls the episode's story was estimated at when registered (None: unknown)."""
        query = cost_statements.episode_estimate(project_id, episode_id)
        value = self.session.in_read(
            "read the episode's estimate", lambda conn: conn.execute(query).scalar()
        )
        return None if value is None else int(value)

    def provider_calls(
        self,
        key: StepKey | None = None,
        *,
        run_id: str | None = None,
        episode: Episode | None = None,
        episodes: Iterable[Episode] | None = None,
    ) -> list[dict[str, Any]]:
        """Provider-call rows (of one step, an episode or ``episodes``, a run, or all)."""
        if key is not None:
            episode = key.episode
        ordered = cost_statements.provider_calls(
            None if key is None else key.step_id,
            project_id=None if episode is None else episode.project_id,
            episode_id=None if episode is None else episode.episode_id,
            run_id=run_id,
            episodes=_pairs(episodes),
        )
        return self.session.in_read(
            "read provider calls", lambda conn: [dict(r) for r in conn.execute(ordered).mappings()]
        )


def _pairs(episodes: Iterable[Episode] | None) -> list[tuple[str, str]] | None:
    return None if episodes is None else [(e.project_id, e.episode_id) for e in episodes]
