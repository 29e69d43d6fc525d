"""One list of storage schemes: the settings check ``PIPELINE_STORAGE_URL`` against
``BUCKET_SCHEMES``, the storage opens exactly those, and each is named for messages.
Before, the schemes were listed twice (the settings' and the object store's) with nothing
keeping them equal."""

from pathlib import Path

import pytest

from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.settings import BUCKET_SCHEMES, STORAGE_SCHEMES
from resources.storage.bucket_location import BUCKET_NAMES
from resources.storage.location import open_storage


def test_every_bucket_scheme_is_named_and_nothing_else() -> None:
    assert set(BUCKET_NAMES) == set(BUCKET_SCHEMES)
    assert STORAGE_SCHEMES[0] == "file" and STORAGE_SCHEMES[1:] == BUCKET_SCHEMES


def test_a_scheme_outside_the_list_is_refused_naming_the_list(tmp_path: Path) -> None:
    with pytest.raises(PipelineError) as refused:
        open_storage("ftp://host/prefix", home=tmp_path)
    assert refused.value.code == ErrorCode.STORAGE_INVALID_URL
    assert f"not one of file, {', '.join(BUCKET_SCHEMES)}" in refused.value.message
