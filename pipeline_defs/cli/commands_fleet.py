"""``storyboard worker``: a Celery worker of the fleet (docs/DESIGN.md#fleet).

Runs launched with ``PIPELINE_EXECUTOR=celery`` (the launchpad, the resume sensor, backfills,
``storyboard materialize``) send each step to the broker; a worker takes them from its queue
and runs them with its own ``PIPELINE_HOME`` (scratch on a bucket), against the ledger, the
storage and the Dagster instance every worker shares.
"""

import os
import socket
import sys

import click

from pipeline_defs.cli.app import main
from pipeline_defs.operations.workspace import load_definitions
from pipeline_defs.resume.errors import PipelineError
from pipeline_defs.resume.fleet_settings import FleetSettings, masked
from pipeline_defs.wiring.fleet import check_backend, check_broker, worker_app
from resources.ledger.store import serve_as


@main.command()
@click.option(
    "--concurrency",
    type=click.IntRange(1, 256),
    default=1,
    show_default=True,
    help="Steps this worker runs at once (one process each).",
)
@click.option(
    "--queue",
    default=None,
    help="Queue to take steps from (default: PIPELINE_CELERY_QUEUE, else 'dagster').",
)
@click.option(
    "--loglevel",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    default="INFO",
    show_default=True,
)
def worker(concurrency: int, queue: str | None, loglevel: str) -> None:
    """Serve steps of the runs launched with PIPELINE_EXECUTOR=celery (a fleet worker).

    The broker and result backend: PIPELINE_CELERY_BROKER_URL (default
    pyamqp://guest@127.0.0.1:5672//) and PIPELINE_CELERY_BACKEND_URL (default
    redis://127.0.0.1:6379/0). Refuses to start when either cannot be reached or the code
    location does not load.
    """
    try:
        settings = FleetSettings.from_env(queue=queue)
        load_definitions()  # a location that cannot load refuses here, not at each task
        app = worker_app(settings)
        check_broker(app, settings)
        check_backend(app, settings)
    except PipelineError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(1)
    name = f"storyboard-{os.getpid()}@{socket.gethostname()}"
    serve_as(name)  # the ledger names its pool children by it too
    click.echo(
        f"worker {name}: queue {settings.queue!r} on {masked(settings.broker_url)}, "
        f"{concurrency} at once",
        err=True,
    )
    app.worker_main(
        [
            "worker",
            "--queues",
            settings.queue,
            "--concurrency",
            str(concurrency),
            "--prefetch-multiplier",
            "1",
            "--hostname",
            name,
            "--loglevel",
            loglevel.upper(),
            "--without-gossip",
            "--without-mingle",
        ]
    )
