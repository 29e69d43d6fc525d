"""The partition and run-submission options are one declaration, shared by every command
that takes them: same names, same help, same behaviour (click's own introspection)."""

from collections.abc import Iterator

import click

from pipeline_defs.cli import main

# The commands acting on one partition, the ones filtering by partitions, and the ones that
# may submit their run through a webserver.
ONE_PARTITION = {"materialize", "force", "redraw", "reset-running", "accept", "sheet"}
PARTITION_FILTER = {"decide", "seal", "status"}
SUBMITTING = {"force", "redraw"}
SUBMISSION = ("graphql_url", "location", "wait")


def _commands(group: click.Group, prefix: str = "") -> Iterator[tuple[str, click.Command]]:
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None
        if isinstance(command, click.Group):
            yield from _commands(command, f"{prefix}{name} ")
        else:
            yield f"{prefix}{name}", command


def _signature(option: click.Parameter) -> tuple[object, ...]:
    assert isinstance(option, click.Option)
    return (
        option.name,
        tuple(option.opts),
        tuple(option.secondary_opts),
        option.help,
        option.required,
        option.multiple,
        option.is_flag,
        option.default,
    )


def _options(name: str) -> dict[str, tuple[object, ...]]:
    """Command name -> the signature of its option called ``name``."""
    return {
        command_name: _signature(param)
        for command_name, command in _commands(main)
        for param in command.params
        if param.name == name
    }


def test_one_partition_option_for_the_commands_acting_on_a_partition() -> None:
    found = _options("partition_key")
    assert set(found) == ONE_PARTITION
    assert len(set(found.values())) == 1, found


def test_one_partition_filter_for_the_commands_reading_partitions() -> None:
    found = _options("partitions")
    assert set(found) == PARTITION_FILTER
    assert len(set(found.values())) == 1, found


def test_one_set_of_submission_options_for_the_submitting_commands() -> None:
    for name in SUBMISSION:
        found = _options(name)
        assert set(found) == SUBMITTING, name
        assert len(set(found.values())) == 1, found
