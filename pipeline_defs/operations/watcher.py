"""Live progress of a run: its event log tailed in a thread, each step reported as it
finishes."""

import threading
import time
from collections.abc import Callable

import dagster as dg

from pipeline_defs.operations.run_report import WATCHED, Progress, Timeline


class RunWatcher:
    """Tails a run's event log in a thread and reports each step as it finishes."""

    def __init__(
        self,
        instance: dg.DagsterInstance,
        run_id: str | None,
        report: Callable[[Progress], None],
    ) -> None:
        self.instance = instance
        self.run_id = run_id
        self.tags: dict[str, str] = {}
        self.report = report
        self.timeline = Timeline()
        self.cursor: str | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="storyboard-progress", daemon=True)

    def find_by_tags(self, tags: dict[str, str]) -> None:
        """Follow the run carrying ``tags`` (its id is Dagster's, not known before launch)."""
        self.tags = dict(tags)

    def _drain(self) -> None:
        if self.run_id is None:
            found = self.instance.get_run_records(dg.RunsFilter(tags=self.tags), limit=1)
            if not found:
                return
            self.run_id = found[0].dagster_run.run_id
        while True:
            connection = self.instance.get_records_for_run(
                self.run_id, cursor=self.cursor, of_type=WATCHED
            )
            for record in connection.records:
                entry = record.event_log_entry
                if entry.dagster_event is None:
                    continue
                progress = self.timeline.feed(entry.dagster_event, entry.timestamp)
                if progress is not None:
                    self.report(progress)
            self.cursor = connection.cursor
            if not connection.has_more:
                return

    def _loop(self) -> None:
        while not self.stop.wait(0.5):
            try:
                self._drain()
            except Exception:  # the run may not exist yet; progress is best effort
                continue

    def __enter__(self) -> "RunWatcher":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        for _attempt in range(40):  # the final drain must see every event (storage may be busy)
            try:
                self._drain()
                return
            except Exception:
                time.sleep(0.25)
        self._drain()
