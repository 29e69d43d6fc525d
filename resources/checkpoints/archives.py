"""Archives and force: nothing is deleted before it is kept.

A replaced checkpoint, a force-cleared one and an artifact about to be redrawn are moved
or copied into the step's ``archive/`` first (the newest ``keep_archives`` checkpoints are
kept). A force leaves a ``.force_cleared`` marker naming the archived checkpoint.
"""

import os
import stat as stat_module
from datetime import UTC, datetime
from pathlib import Path

from pipeline_defs.resume.clock import format_timestamp
from pipeline_defs.resume.files import file_sha256, read_nofollow, symlink_error
from pipeline_defs.resume.partition import StepKey
from resources.checkpoints.atomic import atomic_write_bytes
from resources.checkpoints.links import LinkPolicy
from resources.checkpoints.paths import StorePaths
from resources.checkpoints.reading import EnvelopeReader


class Archives:
    """Archives of one checkpoint tree, and the force marker."""

    def __init__(
        self, paths: StorePaths, links: LinkPolicy, envelopes: EnvelopeReader, keep_archives: int
    ) -> None:
        self.paths = paths
        self.links = links
        self.envelopes = envelopes
        self.keep_archives = keep_archives

    def has_force_marker(self, key: StepKey) -> bool:
        self.links.refuse_links(key)
        return (
            self.links.lstat_ours(self.paths.force_marker_path(key), "a force marker") is not None
        )

    def archive_artifact(self, key: StepKey, relative: str) -> Path | None:
        """Move a present artifact aside into ``archive/`` (named by its sha256 prefix) before
        it is redrawn: nothing is lost. None when there is nothing to move."""
        path = self.links.artifact_path(key, relative)
        if not path.is_file():
            return None
        folder = self._archive_folder(key)
        target = folder / f"{file_sha256(path)[:16]}-{path.name}"
        self.links.lstat_ours(target, "an archived file")
        os.replace(path, target)
        return target

    def archived_artifacts(self, key: StepKey) -> dict[str, set[str]]:
        """Artifact file name -> the sha256 prefixes of its copies in ``archive/`` (named by
        :meth:`archive_artifact`); empty when nothing was archived."""
        try:
            names = os.listdir(self.paths.archive_dir(key))
        except (FileNotFoundError, NotADirectoryError):
            return {}
        archived: dict[str, set[str]] = {}
        for name in names:
            prefix, dash, original = name.partition("-")
            if dash and len(prefix) == 16:
                archived.setdefault(original, set()).add(prefix)
        return archived

    def _archive_folder(self, key: StepKey) -> Path:
        """``archive/`` of the step, created if absent; a link there (or in it) is refused."""
        folder = self.paths.archive_dir(key)
        found = self.links.lstat_ours(folder, "an archive directory")
        if found is None:
            folder.mkdir(parents=True, exist_ok=True)
            found = self.links.lstat_ours(folder, "an archive directory")
        if found is not None:
            self.links.refuse_linked_entries(str(folder), found)
        return folder

    def archive(self, key: StepKey, reason: str) -> Path | None:
        """Copy the current checkpoint into ``archive/``; keep the newest ``keep_archives``."""
        self.links.refuse_links(key)
        source = self.paths.path_for(key)
        found = self.links.lstat_ours(source, "a checkpoint file")
        if found is None or not stat_module.S_ISREG(found.st_mode):
            return None
        folder = self._archive_folder(key)
        stamp = format_timestamp(datetime.now(UTC)).replace(":", "").replace(".", "-")
        target = folder / f"{stamp}-{reason}.json"
        self.links.lstat_ours(target, "an archived checkpoint")
        atomic_write_bytes(target, read_nofollow(source))
        # Prune regular files only, after checking them all: a link among them (found
        # fresh, not from the memo) stops the pruning before anything is deleted.
        with os.scandir(folder) as entries:
            listed = sorted(entries, key=lambda entry: entry.name)
        for entry in listed:
            if entry.is_symlink():
                raise symlink_error(entry.path, "an archived checkpoint")
        archives = [e for e in listed if e.name.endswith(".json") and e.is_file()]
        for old in archives[: max(0, len(archives) - self.keep_archives)]:
            os.unlink(old.path)
        return target

    def force_clear(self, key: StepKey) -> Path | None:
        """Archive the checkpoint, take it out of service and leave a ``.force_cleared`` marker.

        Every link in the step directory is refused before anything is archived, written or
        deleted: a force must not stop half way, nor act through a link.
        """
        self.links.refuse_links_in_tree(key)
        archived = self.archive(key, "force")
        self.paths.step_dir(key).mkdir(parents=True, exist_ok=True)
        marker = self.paths.force_marker_path(key)
        self.links.lstat_ours(marker, "a force marker")
        atomic_write_bytes(marker, (archived.name if archived else "").encode())
        path = self.paths.path_for(key)
        if archived is not None and archived.is_file():
            self.links.lstat_ours(path, "a checkpoint file")
            path.unlink(missing_ok=True)  # its bytes are in the archive
        self.envelopes.forget(path)
        return archived
