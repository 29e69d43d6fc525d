"""Options several commands share, declared once: the partition a command acts on, the
partitions a view is limited to, and how a run is submitted (in-process or a webserver)."""

from collections.abc import Callable
from typing import TypeVar

import click

F = TypeVar("F", bound=Callable[..., object])

# One partition: ``--partition PROJECT/EPISODE`` -> ``partition_key``.
partition_option = click.option(
    "--partition", "partition_key", required=True, help="The partition, PROJECT/EPISODE."
)
# A filter (a view's, ``seal``'s): ``--partition`` repeated -> ``partitions`` (none: every
# partition).
partitions_filter = click.option(
    "--partition", "partitions", multiple=True, help="Limit to PROJECT/EPISODE (repeatable)."
)


# Applied last to first, so ``--help`` lists them in this order.
_SUBMISSION = (
    click.option(
        "--graphql", "graphql_url", help="Submit through a webserver, e.g. http://localhost:3000"
    ),
    click.option("--location", help="Code location name (GraphQL only; inferred if unique)."),
    click.option(
        "--wait/--no-wait", default=True, help="Wait for a GraphQL-submitted run to finish."
    ),
)


def submission_options(command: F) -> F:
    """``--graphql``, ``--location``, ``--wait/--no-wait``: where a run is submitted and
    whether the command waits for it."""
    for option in reversed(_SUBMISSION):
        command = option(command)
    return command
