"""The storage contract (docs/DESIGN.md#storage), one suite for every backend: a directory, S3
and Azure Blob, and the in-memory fake the fast tests use.

Every test taking ``storage`` runs on ``LocalStorage``, on ``ObjectStorage`` over moto's
S3 server (``tests/support/s3_server.py``) and over the azurite emulator
(``tests/support/azurite_server.py``), and on ``MemoryStorage``
(``resources/testing.py``), which passing it proves faithful. Then what only a
local directory can get wrong (links, FIFOs, directories where an object should be) and how
a configured URL is read.
"""

import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import obstore
import pytest
from azurite_server import ACCOUNT_KEY, AzureServer
from obstore.exceptions import GenericError
from s3_server import SECRET, S3Server

from pipeline_defs.resume.errors import PipelineError
from resources.storage import (
    LocalStorage,
    ObjectMeta,
    ObjectStorage,
    Storage,
    mask_url,
    open_storage,
)
from resources.storage.base import TEMP_PREFIX

# The credentials the backends are configured with: no message or detail may show one.
CREDENTIALS = (SECRET, ACCOUNT_KEY)


def _shows_no_credential(error: PipelineError) -> bool:
    return not any(c in str(error) or c in repr(error.details) for c in CREDENTIALS)


def _error(call: Callable[[], Any]) -> PipelineError:
    with pytest.raises(PipelineError) as caught:
        call()
    return caught.value


def _assert_names(error: PipelineError, storage: Storage, key: str) -> None:
    """A storage error names the key and the storage, and carries no credential."""
    text = str(error)
    assert key in text and storage.url in text, text
    assert error.details["key"] == key and error.details["storage"] == storage.url
    assert error.details.get("cause"), error.details
    assert _shows_no_credential(error), text


# -- the contract, on both backends ------------------------------------------------------


def test_put_create_get_head_round_trip(storage: Storage) -> None:
    meta = storage.put_create("p1/e1/alpha/checkpoint.json", b'{"a": 1}')
    assert meta.key == "p1/e1/alpha/checkpoint.json" and meta.size == 8 and meta.e_tag
    assert storage.get("p1/e1/alpha/checkpoint.json") == b'{"a": 1}'
    head = storage.head("p1/e1/alpha/checkpoint.json")
    assert head is not None
    assert (head.key, head.size, head.e_tag, head.version) == (
        meta.key,
        meta.size,
        meta.e_tag,
        meta.version,
    )
    assert head.last_modified is not None
    empty = storage.put_create("empty", b"")
    assert empty.size == 0 and storage.get("empty") == b""


def test_second_create_is_refused_and_keeps_the_first_bytes(storage: Storage) -> None:
    first = storage.put_create("a/obj", b"first")
    error = _error(lambda: storage.put_create("a/obj", b"second"))
    assert error.code == "storage.object_exists" and error.status == 409
    _assert_names(error, storage, "a/obj")
    assert storage.get("a/obj") == b"first"
    head = storage.head("a/obj")
    assert head is not None and head.e_tag == first.e_tag


def test_concurrent_creates_of_one_key_have_exactly_one_winner(storage: Storage) -> None:
    outcomes: dict[int, str] = {}

    def put(index: int) -> None:
        try:
            storage.put_create("race/obj", f"writer {index}".encode())
            outcomes[index] = "won"
        except PipelineError as exc:
            outcomes[index] = exc.code

    threads = [threading.Thread(target=put, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    winners = [i for i, outcome in outcomes.items() if outcome == "won"]
    assert len(outcomes) == 6 and len(winners) == 1, outcomes
    assert set(outcomes.values()) == {"won", "storage.object_exists"}
    assert storage.get("race/obj") == f"writer {winners[0]}".encode()


def test_put_if_match_is_a_compare_and_set(storage: Storage) -> None:
    v1 = storage.put_create("cas/obj", b"v1")
    v2 = storage.put_if_match("cas/obj", b"v2-longer", v1)
    assert v2.key == "cas/obj" and v2.size == 9 and v2.e_tag and v2.e_tag != v1.e_tag
    assert storage.get("cas/obj") == b"v2-longer"
    head = storage.head("cas/obj")
    assert head is not None and head.e_tag == v2.e_tag

    stale = _error(lambda: storage.put_if_match("cas/obj", b"v3", v1))
    assert stale.code == "storage.precondition_failed" and stale.status == 409
    _assert_names(stale, storage, "cas/obj")
    assert storage.get("cas/obj") == b"v2-longer"
    head = storage.head("cas/obj")
    assert head is not None and head.e_tag == v2.e_tag

    # The current version, read back by head, is accepted.
    v3 = storage.put_if_match("cas/obj", b"v3", head)
    assert storage.get("cas/obj") == b"v3" and v3.e_tag != v2.e_tag


def test_put_if_match_of_a_missing_object_fails_and_creates_nothing(storage: Storage) -> None:
    ghost = ObjectMeta("cas/ghost", 2, '"0123"', None, None)
    error = _error(lambda: storage.put_if_match("cas/ghost", b"xx", ghost))
    assert error.code == "storage.precondition_failed"
    assert storage.head("cas/ghost") is None


def test_list_is_recursive_relative_and_per_segment(storage: Storage) -> None:
    keys = ["a/x", "a/b/y", "a/b/c/z", "ab/w", "top"]
    for index, key in enumerate(keys):
        storage.put_create(key, b"#" * (index + 1))

    def listed(prefix: str = "") -> dict[str, int]:
        return {meta.key: meta.size for meta in storage.list(prefix)}

    assert listed() == {key: index + 1 for index, key in enumerate(keys)}
    assert listed("a") == {"a/x": 1, "a/b/y": 2, "a/b/c/z": 3}
    assert listed("a/b") == {"a/b/y": 2, "a/b/c/z": 3}
    assert listed("ab") == {"ab/w": 4}
    assert listed("missing") == {} and listed("a/missing/deeper") == {}
    assert listed("top") == {}  # an object is not a prefix of itself
    for meta in storage.list("a"):
        assert meta.e_tag and meta.last_modified is not None


def test_get_and_head_of_a_missing_key(storage: Storage) -> None:
    assert storage.head("nothing/here") is None
    error = _error(lambda: storage.get("nothing/here"))
    assert error.code == "storage.object_missing" and error.status == 404
    _assert_names(error, storage, "nothing/here")


def test_delete_removes_and_is_idempotent(storage: Storage) -> None:
    storage.put_create("gc/old", b"old")
    storage.put_create("gc/kept", b"kept")
    storage.delete("gc/old")
    assert storage.head("gc/old") is None
    assert _error(lambda: storage.get("gc/old")).code == "storage.object_missing"
    storage.delete("gc/old")  # already gone: not an error
    storage.delete("gc/never")
    assert [meta.key for meta in storage.list("gc")] == ["gc/kept"]
    storage.put_create("gc/old", b"new")  # a collected key can be made again
    assert storage.get("gc/old") == b"new"


BAD_KEYS = [
    "",
    "/abs/key",
    "a//b",
    "a/",
    "a/../b",
    "..",
    "a/./b",
    "nul\x00byte",
    "new\nline",
    f"a/{TEMP_PREFIX}x",
    "k" * 1025,
    "é" * 513,  # 1026 bytes of UTF-8
    7,
    None,
]


@pytest.mark.parametrize("key", BAD_KEYS, ids=lambda k: repr(k)[:20])
def test_invalid_keys_are_refused_before_any_io(
    storage: Storage, key: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_io(*args: object, **kwargs: object) -> None:
        raise AssertionError("I/O before the key was validated")

    for name in ("open", "stat", "lstat", "mkdir", "makedirs", "scandir", "link", "replace"):
        monkeypatch.setattr(os, name, no_io)
    for name in ("get", "head", "put", "list", "delete"):
        monkeypatch.setattr(obstore, name, no_io)
    meta = ObjectMeta("k", 1, "e", None, None)
    calls: list[Callable[[], Any]] = [
        lambda: storage.get(key),
        lambda: storage.head(key),
        lambda: storage.put_create(key, b"x"),
        lambda: storage.put_if_match(key, b"x", meta),
        lambda: storage.delete(key),
    ]
    if key != "":  # the empty prefix is the whole storage
        calls.append(lambda: storage.list(key))
    for call in calls:
        error = _error(call)
        assert error.code == "storage.invalid_key" and error.status == 400, error
        assert storage.url in str(error)
    monkeypatch.undo()
    assert list(storage.list()) == []


def test_storage_url_and_errors_never_show_the_secret(storage: Storage) -> None:
    for credential in CREDENTIALS:
        assert credential not in storage.url and credential not in repr(storage)
    storage.put_create("s/obj", b"x")
    errors = [
        _error(lambda: storage.put_create("s/obj", b"y")),
        _error(lambda: storage.get("s/missing")),
        _error(
            lambda: storage.put_if_match("s/obj", b"z", ObjectMeta("s/obj", 1, "x", None, None))
        ),
    ]
    for error in errors:
        assert _shows_no_credential(error), error


def test_a_listing_gives_the_e_tag_and_size_that_put_and_head_give(storage: Storage) -> None:
    """A manifest records what a put returned; the scrub compares it with a listing. Azure's
    listing gives e_tags bare where its PUT and HEAD quote them: every object looked changed."""
    created = storage.put_create("etag/one", b"one")
    replaced = storage.put_if_match("etag/two", b"two", storage.put_create("etag/two", b"2"))
    listed = {meta.key: meta for meta in storage.list("etag")}
    for written in (created, replaced):
        head = storage.head(written.key)
        assert head is not None
        assert (listed[written.key].e_tag, listed[written.key].size) == (
            written.e_tag,
            written.size,
        )
        assert (head.e_tag, head.size) == (written.e_tag, written.size)


# -- Azure only: where the errors say the endpoint is ---------------------------------------


def test_an_unreachable_azure_endpoint_is_unavailable_naming_host_and_container(
    azure_server: AzureServer,
    azure_env: Callable[[AzureServer], None],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    azure_env(AzureServer(f"http://127.0.0.1:{port}"))
    monkeypatch.setenv("PIPELINE_STORAGE_RETRIES", "1")  # a dead endpoint: fail fast
    storage = open_storage("az://some-container/pre", home=tmp_path)
    error = _error(lambda: storage.get("k"))
    assert error.code == "storage.unavailable" and error.status == 503, error
    text = str(error)
    assert f"127.0.0.1:{port}" in text and "Azure container some-container" in text, text
    assert error.details["endpoint"] == f"127.0.0.1:{port}", error.details
    assert _shows_no_credential(error), text


# -- S3 only: an endpoint that does not answer ---------------------------------------------


def test_an_unreachable_endpoint_is_unavailable_naming_host_and_bucket(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dead = S3Server(f"http://127.0.0.1:{port}")
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    for name, value in dead.env(SECRET).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PIPELINE_STORAGE_RETRIES", "2")  # retried, briefly (test_bucket_faults)
    storage = open_storage("s3://some-bucket/pre", home=tmp_path)
    for call in (
        lambda: storage.get("k"),
        lambda: storage.head("k"),
        lambda: storage.put_create("k", b"x"),
        lambda: list(storage.list()),
    ):
        error = _error(call)
        assert error.code == "storage.unavailable" and error.status == 503, error
        text = str(error)
        assert f"127.0.0.1:{port}" in text and "some-bucket" in text, text
        assert SECRET not in text and SECRET not in repr(error.details)


def test_a_backend_error_text_is_scrubbed_of_credentials(
    s3_server: S3Server,
    aws_env: Callable[[S3Server], None],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """Whatever a backend says, the credential values we hold are cut out of it."""
    aws_env(s3_server)
    storage = open_storage(f"s3://{s3_server.new_bucket()}", home=tmp_path)

    def leaky(*args: object, **kwargs: object) -> None:
        raise GenericError(f"signature mismatch for key {SECRET}\n\nDebug source: {SECRET}")

    monkeypatch.setattr(obstore, "get", leaky)
    error = _error(lambda: storage.get("k"))
    assert error.code == "storage.unavailable" and "signature mismatch" in str(error)
    assert SECRET not in str(error) and SECRET not in repr(error.details)


def test_a_missing_bucket_is_bucket_missing(
    s3_server: S3Server, aws_env: Callable[[S3Server], None], tmp_path: Path
) -> None:
    aws_env(s3_server)
    storage = open_storage("s3://no-such-bucket-here/p", home=tmp_path)
    for call in (lambda: storage.put_create("k", b"x"), lambda: storage.get("k")):
        error = _error(call)
        assert error.code == "storage.bucket_missing" and "no-such-bucket-here" in str(error)
        assert "<Code>" not in str(error), error
        assert SECRET not in str(error)


# -- local only: links, FIFOs, directories ---------------------------------------------------


def _snapshot(directory: Path) -> dict[str, bytes | str]:
    """Every entry below ``directory`` with its bytes (files) or kind: to compare before/after."""
    out: dict[str, bytes | str] = {}
    for path in sorted(directory.rglob("*")):
        rel = str(path.relative_to(directory))
        out[rel] = path.read_bytes() if path.is_file() and not path.is_symlink() else "dir"
    return out


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory outside the storage root that a planted link points into."""
    target = tmp_path / "outside"
    (target / "b").mkdir(parents=True)
    (target / "x").write_bytes(b"outside x")
    (target / "b" / "y").write_bytes(b"outside y")
    return target


def test_a_link_at_an_intermediate_directory_is_refused(tmp_path: Path, outside: Path) -> None:
    storage = LocalStorage(tmp_path / "home")
    (tmp_path / "home" / "p").mkdir(parents=True)
    (tmp_path / "home" / "p" / "a").symlink_to(outside, target_is_directory=True)
    before = _snapshot(outside)
    calls: list[Callable[[], Any]] = [
        lambda: storage.put_create("p/a/new", b"evil"),
        lambda: storage.put_create("p/a/b/new", b"evil"),
        lambda: storage.put_create("p/a/x", b"evil"),
        lambda: storage.get("p/a/x"),
        lambda: storage.head("p/a/x"),
        lambda: storage.put_if_match("p/a/x", b"evil", ObjectMeta("p/a/x", 9, "e", None, None)),
        lambda: storage.delete("p/a/x"),
        lambda: list(storage.list("p/a")),
        lambda: list(storage.list("p")),
        lambda: list(storage.list()),
    ]
    for call in calls:
        error = _error(call)
        assert error.code == "checkpoint.symlink", error
        assert str(tmp_path / "home" / "p" / "a") in str(error)
    assert _snapshot(outside) == before
    assert (tmp_path / "home" / "p" / "a").is_symlink()  # left in place


def test_a_link_at_the_key_is_refused_and_left_in_place(tmp_path: Path, outside: Path) -> None:
    storage = LocalStorage(tmp_path / "home")
    (tmp_path / "home" / "d").mkdir(parents=True)
    link = tmp_path / "home" / "d" / "obj"
    link.symlink_to(outside / "x")
    dangling = tmp_path / "home" / "d" / "dangling"
    dangling.symlink_to(outside / "not-yet")
    before = _snapshot(outside)
    calls: list[Callable[[], Any]] = [
        lambda: storage.put_create("d/obj", b"evil"),
        lambda: storage.put_create("d/dangling", b"evil"),
        lambda: storage.get("d/obj"),
        lambda: storage.head("d/obj"),
        lambda: storage.put_if_match("d/obj", b"evil", ObjectMeta("d/obj", 9, "e", None, None)),
        lambda: storage.delete("d/obj"),
        lambda: list(storage.list("d")),
    ]
    for call in calls:
        assert _error(call).code == "checkpoint.symlink"
    assert _snapshot(outside) == before and not (outside / "not-yet").exists()
    assert link.is_symlink() and dangling.is_symlink()


def test_non_files_where_an_object_should_be_are_refused_without_hanging(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "home")
    storage.put_create("d/file", b"data")
    (tmp_path / "home" / "d" / "dir").mkdir()
    os.mkfifo(tmp_path / "home" / "d" / "fifo")
    outcomes: dict[str, list[str]] = {}

    def codes(key: str) -> list[str]:
        return [
            _error(call).code
            for call in (
                lambda: storage.get(key),
                lambda: storage.head(key),
                lambda: storage.put_create(key, b"x"),
                lambda: storage.delete(key),
                lambda: storage.put_if_match(key, b"x", ObjectMeta(key, 1, "e", None, None)),
            )
        ]

    def attempt() -> None:  # a thread: a FIFO opened for reading would block forever
        outcomes["d/dir"] = codes("d/dir")
        outcomes["d/fifo"] = codes("d/fifo")
        outcomes["list"] = [_error(lambda: list(storage.list("d"))).code]

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), "a FIFO was opened for reading"
    assert outcomes == {
        "d/dir": ["storage.not_an_object"] * 5,
        "d/fifo": ["storage.not_an_object"] * 5,
        "list": ["storage.not_an_object"],
    }
    assert (tmp_path / "home" / "d" / "dir").is_dir()
    assert (tmp_path / "home" / "d" / "fifo").is_fifo()
    assert storage.get("d/file") == b"data"


def test_a_file_where_a_directory_should_be(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "home")
    storage.put_create("f", b"a file")
    error = _error(lambda: storage.put_create("f/below", b"x"))
    assert error.code == "storage.not_an_object" and "a regular file" in str(error)
    assert storage.head("f/below") is None  # no object can be below a file
    assert _error(lambda: storage.get("f/below")).code == "storage.object_missing"
    assert storage.get("f") == b"a file"


def test_local_writes_are_files_in_todays_layout_and_leave_no_temp(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "home")
    storage.put_create("p/e/step/checkpoint.json", b"{}")
    meta = storage.put_create("p/e/step/a.png", b"png")
    storage.put_if_match("p/e/step/a.png", b"png2", meta)
    home = tmp_path / "home"
    assert (home / "p/e/step/checkpoint.json").read_bytes() == b"{}"
    assert (home / "p/e/step/a.png").read_bytes() == b"png2"
    assert sorted(p.name for p in (home / "p/e/step").iterdir()) == ["a.png", "checkpoint.json"]
    # A killed writer's temp file is not an object.
    (home / "p/e/step" / f"{TEMP_PREFIX}leftover").write_bytes(b"partial")
    assert sorted(m.key for m in storage.list()) == ["p/e/step/a.png", "p/e/step/checkpoint.json"]
    assert storage.is_local and storage.url == str(home)


# -- reading the configured URL ------------------------------------------------------------


def test_open_storage_local_forms(tmp_path: Path) -> None:
    for url in (None, "", "  "):
        opened = open_storage(url, home=tmp_path / "home")
        assert isinstance(opened, LocalStorage) and opened.root == tmp_path / "home"
    for url in (str(tmp_path / "elsewhere"), f"file://{tmp_path}/elsewhere"):
        opened = open_storage(url, home=tmp_path / "home")
        assert isinstance(opened, LocalStorage) and opened.root == tmp_path / "elsewhere"
        assert opened.is_local


def test_open_storage_bucket_forms(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "acct")
    for url, shown in (
        ("s3://bucket/pre/fix", "s3://bucket/pre/fix"),
        ("s3://bucket/pre/fix/", "s3://bucket/pre/fix"),
        ("s3://bucket", "s3://bucket"),
        ("gs://bucket/p", "gs://bucket/p"),
        ("az://container/p", "az://container/p"),
    ):
        opened = open_storage(url, home=tmp_path)
        assert isinstance(opened, ObjectStorage) and not opened.is_local
        assert opened.url == shown
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT_NAME")
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT", raising=False)
    error = _error(lambda: open_storage("az://container/p", home=tmp_path))
    assert error.code == "storage.config" and "az://container/p" in str(error)


@pytest.mark.parametrize(
    "url",
    [
        "http://host/path",
        "ftp://host/x",
        "abfs://container/x",
        "s3://",
        "s3://b",
        "s3://bucket/a/../b",
        "s3://bucket/a//b",
        "s3://bucket:9000/x",
        f"s3://bucket/x?X-Amz-Signature={SECRET}",
        f"s3://AKIA:{SECRET}@bucket/x",
        f"gs://{SECRET}@bucket/x",
        "file://otherhost/x",
        f"file:///x?token={SECRET}",
    ],
)
def test_open_storage_refuses_invalid_urls_without_showing_secrets(
    url: str, tmp_path: Path
) -> None:
    error = _error(lambda: open_storage(url, home=tmp_path))
    assert error.code == "storage.invalid_url" and error.status == 400, error
    assert SECRET not in str(error) and SECRET not in repr(error.details)


def test_mask_url() -> None:
    assert mask_url(f"s3://user:{SECRET}@b/x?sig={SECRET}&a=1") == "s3://user:***@b/x?sig=***&a=***"
    assert mask_url(f"az://{SECRET}@c/p") == "az://***@c/p"
    assert mask_url("/plain/path") == "/plain/path"
    assert mask_url("s3://bucket/prefix") == "s3://bucket/prefix"


def test_an_http_endpoint_without_allow_http_names_the_fix(
    s3_server: S3Server,
    aws_env: Callable[[S3Server], None],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """A local S3 (moto, MinIO) at ``http://`` fails until ``AWS_ALLOW_HTTP=true``; the error
    said "HTTP error: builder error" and nothing else. It names the variable now."""
    aws_env(s3_server)
    monkeypatch.delenv("AWS_ALLOW_HTTP")
    bucket = s3_server.new_bucket()
    error = _error(lambda: open_storage(f"s3://{bucket}/p", home=tmp_path))
    assert error.code == "storage.config" and "AWS_ALLOW_HTTP=true" in str(error), error
    assert _shows_no_credential(error)
