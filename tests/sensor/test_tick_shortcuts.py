"""The tick's shortcuts for big batches still see every change (BENCHMARKS.md, "Sensor tick").

- the rows are grouped by partition once per tick and each partition is judged from its
  own group (no key built per step): a row changed in one partition is judged in that
  partition, with that row's state in the facts and run key;
- the facts of a SKIP are built only when an evaluation needs them (kept to clear a block,
  or the upstream of a kept one): a launch's upstream facts are still those of its
  settled upstream steps, so its run key moves when one of them changes;
- the sensor asks Dagster once whether its run requests' partitions exist, so Dagster's
  own resolution of the requests asks nothing per request.
"""

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from sensor_steps import SENSOR_STEPS, seed, set_row, stores_for

from pipeline_defs.definitions import build_resources
from pipeline_defs.judging.evaluation import BatchJudge, evaluate_partitions, rows_by_partition
from pipeline_defs.judging.registry import forget_tickers
from pipeline_defs.judging.step_evaluation import Facts, Verdict
from pipeline_defs.judging.tick import ResumeTicker
from pipeline_defs.judging.tick_result import TickConfig
from pipeline_defs.resume.partition import StepKey
from pipeline_defs.wiring.assets import build_step_assets
from resources.pipeline import PipelineResource
from sensors.report import REPORT_JOB
from sensors.resume_sensor import build_resume_sensor

NOW = datetime.now(UTC).replace(microsecond=0)


def test_a_changed_row_is_judged_in_its_own_partition(sqlite_url: str, pipeline_home: Path) -> None:
    stores = stores_for(pipeline_home, sqlite_url)
    keys = ["p/e1", "p/e2", "p/e3"]
    for pk in keys:
        seed(stores, pk)
    ticker = ResumeTicker(SENSOR_STEPS, stores, TickConfig(workers=1))
    first = ticker.tick(keys, NOW, None)
    assert first.launches == [] and first.stats.judged == 12

    key = StepKey("p", "e2", "mid")
    set_row(stores, key, status="failed", run_id="boom:1", updated_at="2099-01-01T00:00:00Z")
    changed = ticker.tick(keys, NOW, first.cursor)
    assert changed.stats.changed == {"ledger": 1}
    launches = {(ev.step_id, ev.partition_key): ev for ev in changed.launches}
    assert set(launches) == {("mid", "p/e2")}  # e1, e3 untouched; end is settled (sealed)
    mid = launches["mid", "p/e2"]
    assert (mid.facts.status, mid.facts.run_id) == ("failed", "boom:1")  # this row's state
    # The settled upstream (src, a SKIP whose facts were built only now) is in the key.
    src_row = stores.ledger.get(StepKey("p", "e2", "src"))
    assert src_row is not None
    assert mid.upstream[0].status == "completed" and mid.upstream[0].run_id == src_row.run_id
    assert mid.run_key is not None

    # The same partition judged alone, from the store's rows as they are (no tick): the
    # same decisions, facts and run key.
    alone = {
        ev.step_id: ev
        for ev in evaluate_partitions(SENSOR_STEPS, stores, ["p/e2"], NOW)
        if ev.verdict is Verdict.LAUNCH
    }
    assert alone["mid"].facts.status == "failed"
    assert alone["mid"].upstream == mid.upstream

    # A change upstream of a launch moves its run key (the upstream facts are not stale).
    set_row(stores, StepKey("p", "e2", "src"), updated_at="2099-01-01T00:00:01Z")
    again = ticker.tick(keys, NOW, changed.cursor)
    moved = {(ev.step_id, ev.partition_key): ev for ev in again.launches}
    assert moved["mid", "p/e2"].run_key != mid.run_key


def test_rows_by_partition_keeps_each_row_under_its_own_partition(
    sqlite_url: str, pipeline_home: Path
) -> None:
    stores = stores_for(pipeline_home, sqlite_url)
    for pk in ("p/e1", "q/e1"):  # same episode id in two projects
        seed(stores, pk, "src")
    judge = BatchJudge(SENSOR_STEPS, stores)
    rows = judge.load_rows(["p/e1", "q/e1"])
    grouped = rows_by_partition(rows)
    assert set(grouped) == {"p/e1", "q/e1"}
    for pk, part in grouped.items():
        assert set(part) == {"src"}
        key, row = part["src"]
        assert key.partition_key == pk and rows[key] is row
    # Grouped or not, the same evaluations (every SKIP kept here: evaluate_partitions).
    plain = judge.evaluate(["p/e1", "q/e1"], NOW, rows)
    sliced = judge.evaluate(["q/e1"], NOW, rows, grouped=grouped)
    assert [ev for ev in plain if ev.partition_key == "q/e1"] == sliced
    src = next(ev for ev in sliced if ev.step_id == "src")
    assert src.verdict is Verdict.SKIP and src.facts != Facts()  # built when kept


# --------------------------------------------------------------------------- Dagster side
@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    forget_tickers()
    with dg.instance_for_test() as fresh:
        yield fresh
    forget_tickers()


def test_dagster_checks_the_requested_partitions_in_one_question(
    instance: dg.DagsterInstance, sqlite_url: str, pipeline_home: Path
) -> None:
    pipeline = PipelineResource(home=str(pipeline_home), db_url=sqlite_url)
    pipeline.ledger().migrate()
    sensor = build_resume_sensor(SENSOR_STEPS, clock=lambda: NOW)
    defs = dg.Definitions(
        assets=build_step_assets(SENSOR_STEPS),
        sensors=[sensor],
        resources=build_resources(pipeline),
    )
    keys = [f"p/e{n}" for n in range(5)]
    instance.add_dynamic_partitions("episodes", keys)
    asked: list[Any] = []
    one_by_one = instance.has_dynamic_partition

    def counted(partitions_def_name: str, partition_key: str) -> bool:
        asked.append(partition_key)
        return one_by_one(partitions_def_name, partition_key)

    instance.has_dynamic_partition = counted  # type: ignore[method-assign]
    context = dg.build_sensor_context(
        instance=instance,
        instance_ref=instance.get_ref(),  # as the daemon builds it: with Dagster's loader
        definitions=defs,
        resources={"pipeline": pipeline},
    )
    with dg.partition_loading_context(dynamic_partitions_store=instance):
        result = sensor.evaluate_tick(context)  # resolves (and validates) the run requests
    runs = [r for r in result.run_requests or [] if r.job_name != REPORT_JOB]
    assert sorted(r.partition_key or "" for r in runs) == keys  # one run per new partition
    assert all(r.tags.get("dagster/partition") == r.partition_key for r in runs)
    assert asked == []  # answered from the one batched question, not one query per run
