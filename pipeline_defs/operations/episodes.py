"""Registering an episode: its story checked at the door and copied in, project.yaml
created if missing, the Dagster partition added (``storyboard add-episode``)."""

import os
import stat as stat_module
from pathlib import Path
from typing import Any

import dagster as dg
import yaml

from pipeline_defs.operations.workspace import PARTITIONS_NAME, Workspace
from pipeline_defs.project import (
    ProjectConfig,
    StoryKnobs,
    load_project_config,
    parse_project_config,
    refuse_input_links,
    refuse_project_links,
)
from pipeline_defs.resume.budget import CallCap, cap_in_force
from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.files import describe_mode, read_nofollow, write_file_under
from pipeline_defs.resume.layout import DataLayout
from pipeline_defs.resume.money import money_text, to_micros
from pipeline_defs.resume.partition import Episode, validate_id
from pipeline_defs.storyboard.estimate import CallEstimate, estimate_calls, estimate_cost
from pipeline_defs.storyboard.story_source import accept_story


def _read_story(path: Path, knobs: StoryKnobs) -> tuple[bytes, dict[str, Any]]:
    """The operator's story file, refused at the door by the rules ``story_source`` applies
    later (size, NUL bytes, encoding, no text), so nothing is registered that cannot run.

    The source is the operator's own file (following a link to it is theirs to choose);
    what it is when it is not a file is said plainly, and a device or FIFO is never opened
    (``/dev/zero`` would be read forever, a FIFO would hang).
    """
    try:
        found = os.stat(path)
    except FileNotFoundError:
        raise PipelineError(
            ErrorCode.INPUT_INVALID, f"story file {str(path)!r} does not exist"
        ) from None
    except OSError as exc:
        raise PipelineError(
            ErrorCode.INPUT_INVALID, f"story file {str(path)!r} cannot be read: {exc.strerror}"
        ) from None
    if not stat_module.S_ISREG(found.st_mode):
        raise PipelineError(
            ErrorCode.INPUT_INVALID,
            f"story file {str(path)!r} is {describe_mode(found.st_mode)}, not a story file",
        )
    try:
        with open(path, "rb") as handle:
            payload = handle.read(knobs.max_bytes + 1)  # never more than the limit allows
    except OSError as exc:
        raise PipelineError(
            ErrorCode.INPUT_INVALID, f"story file {str(path)!r} cannot be read: {exc.strerror}"
        ) from None
    _text, parsed = accept_story(path, payload, knobs, file_size=found.st_size)
    return payload, parsed


def _project_in_force(
    home: Path, project_id: str, config_path: Path, template: bytes
) -> ProjectConfig:
    """The project config in force (story limits, knobs, budget): its file's, else the
    template's."""
    if config_path.exists():
        return load_project_config(home, project_id)  # refuses an invalid file
    raw = yaml.safe_load(template.decode("utf-8"))
    return parse_project_config(raw, source="the project.yaml template")


def check_estimate(
    ws: Workspace, episode: Episode, parsed: dict[str, Any], project: ProjectConfig, where: Path
) -> tuple[CallEstimate | None, CallCap]:
    """The story's estimated calls and the episode's cap; ``budget.over_cap`` (both numbers
    and the command that raises the cap) when the estimate is over it.

    The estimate is the reference storyboard's: a code location whose steps are others
    gets none (and no refusal; its calls are still capped one by one)."""
    settings = ws.settings
    cap = cap_in_force(
        settings.max_calls_per_episode,
        settings.max_calls_source,
        project.budget.max_calls_per_episode,
        str(where),
    )
    estimate = estimate_calls(parsed, project)
    if not set(estimate.per_step) <= set(ws.catalog):
        return None, cap
    if estimate.total > cap.limit:
        raise PipelineError(
            ErrorCode.BUDGET_OVER_CAP,
            f"episode {episode.partition_key}: the story's {estimate.scenes} scenes are "
            f"estimated at {estimate.total} provider calls, over the episode's cap of "
            f"{cap.limit} ({cap.where()}); nothing was registered. Shorten the story, lower "
            f"the project's knobs (scenes.shots_per_scene, scenes.variations_per_shot, "
            f"entities.max_characters), or raise the cap: "
            f"{cap.raise_command(cap.suggestion(estimate.total))}",
            details={"estimate": estimate.total, "cap": cap.limit},
        )
    return estimate, cap


def default_project_yaml() -> bytes:
    """``ProjectConfig()`` defaults as YAML."""
    return yaml.safe_dump(ProjectConfig().as_dict(), sort_keys=False).encode("utf-8")


def register_partition(instance: dg.DagsterInstance, partition_key: str) -> bool:
    """Add the dynamic partition if missing; True if it was added."""
    Episode.parse(partition_key)
    if instance.has_dynamic_partition(PARTITIONS_NAME, partition_key):
        return False
    instance.add_dynamic_partitions(PARTITIONS_NAME, [partition_key])
    return True


def add_episode(
    ws: Workspace,
    project_id: str,
    episode_id: str,
    story: Path,
    *,
    replace: bool = False,
    keep_existing: bool = False,
    config_template: bytes | None = None,
) -> dict[str, Any]:
    """Copy the story in (atomically), create project.yaml if missing, register the partition.

    Ids are validated before any path is built. A different story already in place is
    refused unless ``replace`` (editing a story blocks ``story_source`` until a force).
    """
    validate_id(project_id, "project_id")
    validate_id(episode_id, "episode_id")
    episode = Episode(project_id, episode_id)
    home = Path(ws.home)
    target = Path(DataLayout.of(home).story_file(project_id, episode_id))
    # Nothing outside the home: a link anywhere on either path is refused before anything
    # below the home is read or created (and the writes re-check it, race-free).
    config_path = refuse_project_links(home, project_id)
    refuse_input_links(home, target)
    template = config_template or default_project_yaml()
    # On object storage the published inputs are the truth: compare with them, not with
    # whatever an earlier process left in this home.
    ws.checkpoints.sync_inputs(project_id, episode_id)
    project = _project_in_force(home, project_id, config_path, template)
    payload, parsed = _read_story(Path(story), project.story)
    # The spend cap at the door: a story estimated over it is refused before anything is
    # written (docs/DESIGN.md#spend-cap).
    estimate, cap = check_estimate(ws, episode, parsed, project, config_path)
    instance = ws.instance()  # fail before writing anything if DAGSTER_HOME is unusable
    assert instance is not None
    current = os.lstat(target) if target.exists() else None
    if current is not None and not stat_module.S_ISREG(current.st_mode):
        raise PipelineError(
            ErrorCode.INPUT_INVALID,
            f"{target} is {describe_mode(current.st_mode)}, where the episode's story file "
            "should be: nothing is written over it; remove it to go on",
        )
    if current is not None and read_nofollow(target) == payload:
        story_state = "unchanged"
    elif current is not None and keep_existing:
        story_state = "kept existing"
    elif current is not None and not replace:
        raise PipelineError(
            ErrorCode.INPUT_STORY_EXISTS,
            f"{target} already holds a different story; pass --replace to overwrite it "
            "(story_source will then block until an explicit force)",
            status=409,
        )
    else:
        story_state = "replaced" if current is not None else "created"
        write_file_under(home, target, payload)
    if config_path.exists():
        load_project_config(home, project_id)  # refuse an invalid file, naming the key
        config_state = "exists"
    else:
        write_file_under(home, config_path, template)
        config_state = "created"
    if ws.checkpoints.publish_inputs(project_id, episode_id):  # every machine reads them
        # A seal on object storage names the inputs its run verified by e_tag, and other
        # machines trust it until told: tell them (judged the long way, the edit seen).
        ws.ledger.clear_episode_seals(project_id, episode_id)
    if estimate is not None:  # what a [budget.exhausted] refusal's suggestion covers
        ws.ledger.note_episode_estimate(project_id, episode_id, estimate.total)
    added = register_partition(instance, episode.partition_key)
    cost = None if estimate is None else estimate_cost(estimate, project, len(payload))
    budget = project.budget.max_cost_per_episode
    warnings = []
    if cost is not None and budget is not None and cost.total > to_micros(budget):
        # Only said: the budget itself refuses call by call (docs/DESIGN.md#money-budgets).
        warnings.append(
            f"the story's estimated calls may cost up to {money_text(cost.total)}, over the "
            f"episode's money budget of {money_text(to_micros(budget))} "
            f"(budget.max_cost_per_episode in {config_path}); registered anyway: calls are "
            "refused only once the budget is spent, and the estimate is a worst case"
        )
    return {
        "partition": episode.partition_key,
        "story": str(target),
        "story_state": story_state,
        "project_config": str(config_path),
        "project_config_state": config_state,
        "partition_registered": "added" if added else "already registered",
        "estimated_calls": estimate.total if estimate is not None else None,
        "estimate": estimate.as_dict() if estimate is not None else None,
        "max_calls_per_episode": cap.limit,
        "estimated_cost": cost.as_dict() if cost is not None else None,
        "max_cost_per_episode": None if budget is None else money_text(to_micros(budget)),
        "warnings": warnings,
    }
