"""``resume_report``: the small job that publishes the resume sensor's block reports.

Why a run and not run-less events. Dagster stores a sensor's run-less
``AssetCheckEvaluation`` with an empty run id, and its ``asset_check_executions`` table has
a unique index on (asset, check, run id, partition): the second run-less evaluation of the
same asset partition (a "passed" after a "failed", or a new block after a cleared one) is
refused and the whole sensor tick fails in the daemon — every later tick too, so nothing
is ever launched again.

Evaluations logged inside a run are stored under that run's id, which is unique. So the
sensor requests one ``resume_report`` run per tick that changed any block (at most
``MAX_REPORTS_PER_RUN`` reports each), and that run's one op logs the evaluations. What a
user sees is unchanged: the ``resume_integrity`` check of the asset partition fails with
origin, reason and what to do, and passes when the block clears; the check's run link
leads to the report run. The launches of a tick are separate run requests, so a report
that cannot be published (a report run that fails) never holds back a launch.
"""

import hashlib
import json
from collections.abc import Mapping, Sequence

import dagster as dg

from pipeline_defs.wiring.assets import RESUME_CHECK

REPORT_JOB = "resume_report"
REPORT_OP = "publish_resume_checks"
# Reports per run: a config-wide block over 10,000 episodes becomes 20 small runs; the run
# config of one (about 1 KB per report) stays far below what run storage handles with ease.
MAX_REPORTS_PER_RUN = 500


class CheckReport(dg.Config):
    """One ``resume_integrity`` evaluation of one asset partition."""

    step_id: str
    partition: str
    passed: bool
    description: str
    metadata: dict[str, str]

    def evaluation(self) -> dg.AssetCheckEvaluation:
        return dg.AssetCheckEvaluation(
            asset_key=dg.AssetKey(self.step_id),
            check_name=RESUME_CHECK,
            passed=self.passed,
            partition=self.partition,
            metadata=dict(self.metadata),
            description=self.description,
        )


class ReportConfig(dg.Config):
    reports: list[CheckReport]


@dg.op(name=REPORT_OP, description="Logs the resume sensor's resume_integrity evaluations.")
def publish_resume_checks(context: dg.OpExecutionContext, config: ReportConfig) -> None:
    for report in config.reports:
        # log_event handles an AssetCheckEvaluation (its first isinstance branch after a
        # materialization); dagster's UserEvent annotation does not list the type.
        context.log_event(report.evaluation())  # type: ignore[arg-type]
    context.log.info(f"published {len(config.reports)} resume_integrity evaluations")


@dg.job(
    name=REPORT_JOB,
    description=(
        "Started by resume_sensor when blocks appear or clear: publishes them as "
        "resume_integrity check evaluations on the asset partitions."
    ),
    tags={"resume/kind": "report"},
)
def resume_report() -> None:
    publish_resume_checks()


def report_requests(
    reports: Sequence[Mapping[str, object]], previous_cursor: str | None
) -> list[dg.RunRequest]:
    """Report runs for one tick's block changes, ``MAX_REPORTS_PER_RUN`` at most each.

    The run key is derived from the tick's starting cursor and the reports, so a tick that
    Dagster evaluates again from the same cursor does not publish twice, while the same
    block reported again after a clearance (a new cursor) gets a new run.
    """
    requests = []
    for start in range(0, len(reports), MAX_REPORTS_PER_RUN):
        chunk = list(reports[start : start + MAX_REPORTS_PER_RUN])
        digest = hashlib.sha256(
            json.dumps([previous_cursor or "", chunk], sort_keys=True).encode()
        ).hexdigest()[:24]
        requests.append(
            dg.RunRequest(
                run_key=f"resume-report:{digest}",
                job_name=REPORT_JOB,
                run_config={"ops": {REPORT_OP: {"config": {"reports": chunk}}}},
                tags={"resume/reports": str(len(chunk))},
            )
        )
    return requests


def reported(requests: Sequence[dg.RunRequest]) -> list[CheckReport]:
    """The reports carried by the ``resume_report`` requests among ``requests``."""
    found: list[CheckReport] = []
    for request in requests:
        if request.job_name == REPORT_JOB:
            config = request.run_config["ops"][REPORT_OP]["config"]
            found.extend(CheckReport(**report) for report in config["reports"])
    return found
