"""The storage contract on a bucket: S3, Google Cloud Storage or Azure Blob, via obstore.

``s3://bucket/prefix``, ``gs://bucket/prefix``, ``az://container/prefix``: the prefix (if
any) is joined to every key, so one bucket can hold several pipeline homes. Credentials,
region and endpoint come only from the environment or the platform (``AWS_*``,
``GOOGLE_APPLICATION_CREDENTIALS``, ``AZURE_STORAGE_*``, instance roles), read by obstore
when the storage is opened — never from the URL (one with a user part or a query is
refused) and never written anywhere. Errors name the endpoint host and the bucket, and
every credential value the process holds is cut out of a backend's error text.

This module holds :class:`ObjectStorage`, the storage on obstore; the URL and the endpoint
are :mod:`~resources.storage.bucket_location`'s, the retry budget and what a failure is
:mod:`~resources.storage.retry_budget`'s, a failure's words
:mod:`~resources.storage.backend_errors`'s and its error
:mod:`~resources.storage.bucket_failures`', and the keys obstore cannot parse
:mod:`~resources.storage.unparseable_keys`'.

Create-only puts are ``If-None-Match: *`` and replacements ``If-Match: <e_tag>`` (plus the
object version where the bucket is versioned): the bucket itself arbitrates, so both are
exact whatever the caller holds.

Transient failures (a refused or dropped connection, a request timing out, a 5xx answer)
are retried with exponential backoff and jitter inside a bounded budget, read when the
storage is opened: ``PIPELINE_STORAGE_RETRIES`` retries (default 10) within
``PIPELINE_STORAGE_RETRY_BUDGET_SECONDS`` (default 120) from the first try, each request
timing out after ``PIPELINE_STORAGE_TIMEOUT_SECONDS`` (default 30). Reads, lists and
deletes are retried by obstore's own retry (configured with that budget); conditional puts
by our loop, because a put whose answer was lost may have landed: the retry then meets our
own object (``If-None-Match`` / ``If-Match`` refuse it). So after a try in doubt (anything
but a refused connection), a refusal is checked against the stored bytes: if the object
now holds exactly the bytes we put, the put is ours and succeeds with the stored version;
otherwise it is refused as usual. Decision: bytes are compared in full (one GET, only in
that rare case) rather than an e_tag, which is an MD5 on S3 alone. Without a try in doubt
the refusal stands even for identical bytes, as on a local directory. The error once the
budget is spent names the endpoint, the bucket and the budget.

A key obstore cannot parse (``..`` or ``.`` parts, an empty part, a control character),
planted by another tool, is foreign: ``list`` skips it and logs it once per storage (a
warning naming the key and the bucket; ``foreign_keys`` keeps them for a caller to show).
obstore fails a whole LIST page on such a key, so the listing resumes just after it and
lists again, folder by folder, what the page held before it. One limit of obstore 0.12
remains: a folder whose own entries include a foreign part cannot be listed level by level,
so objects of ours in that folder sorting before the foreign part on its page (names
starting with one of `` !"#$%&'()*+,-`` before a ``..``, say) may be left out: a warning
says which folder. Our own keys start with a letter or a digit.
"""

import logging
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import obstore
from obstore.exceptions import (
    AlreadyExistsError,
    BaseError,
    InvalidPathError,
    PreconditionError,
)
from obstore.store import AzureStore, GCSStore, S3Store

from pipeline_defs.resume.errors import ErrorCode, PipelineError
from resources.storage.backend_errors import (
    BACKEND_ERRORS,
    credential_values,
)
from resources.storage.base import (
    TEMP_PREFIX,
    ObjectMeta,
    error_details,
    scrub,
    short_cause,
    validate_key,
)
from resources.storage.bucket_failures import BucketFailures
from resources.storage.bucket_location import (
    ALLOW_HTTP,
    BUCKET_NAMES,
    BucketLocation,
    allows_http,
    endpoint_host,
    http_endpoint,
    parse_bucket_url,
)
from resources.storage.retry_budget import RetryBudget, backoff, in_doubt, transient
from resources.storage.unparseable_keys import bad_key, poisoned, resume_after

if TYPE_CHECKING:
    from obstore import ObjectMeta as ObstoreMeta
    from obstore import PutMode, PutResult, UpdateVersion

_log = logging.getLogger(__name__)


def _quoted(e_tag: str | None) -> str | None:
    """One form for an e_tag, the quoted one of an HTTP header: Azure's (and GCS's) listings
    give it bare where a HEAD or a PUT gives it quoted, so a listing would otherwise never
    match a manifest (the scrub took every object of an Azure container for changed)."""
    if e_tag is None or e_tag.startswith(('"', 'W/"')):
        return e_tag
    return f'"{e_tag}"'


def _build(
    location: BucketLocation, budget: RetryBudget, *, retries: int | None = None
) -> S3Store | GCSStore | AzureStore:
    prefix = location.prefix or None
    options = budget.client_options(allows_http(location.scheme))
    retry = budget.retry_config(retries)
    if location.scheme == "s3":
        return S3Store(location.bucket, prefix=prefix, client_options=options, retry_config=retry)
    if location.scheme == "gs":
        return GCSStore(location.bucket, prefix=prefix, client_options=options, retry_config=retry)
    return AzureStore(
        container_name=location.bucket, prefix=prefix, client_options=options, retry_config=retry
    )


class ObjectStorage:
    """Objects in a bucket (see the module docstring for the guarantees)."""

    def __init__(self, url: str) -> None:
        self.location = parse_bucket_url(url)
        # Read when the storage is opened (never at import): for naming it in errors.
        self.endpoint = endpoint_host(self.location.scheme)
        self.budget = RetryBudget.from_env(self.url)
        self._failures = BucketFailures(self.location, self.endpoint, self.budget)
        # Foreign keys met by list (full key in the bucket -> why obstore refused it).
        self.foreign_keys: dict[str, str] = {}
        self._reported: set[str] = set()
        self._bucket_seen = False
        self._lock = threading.Lock()
        variable = http_endpoint(self.location.scheme)
        if variable is not None and not allows_http(self.location.scheme):
            cause = (
                f"the endpoint {variable} is http:// and plain HTTP is off: set "
                f"{ALLOW_HTTP['s3']}=true (a local S3 such as MinIO or moto) or use https://"
            )
            raise PipelineError(
                ErrorCode.STORAGE_CONFIG,
                f"cannot open storage {self.url} (endpoint {self.endpoint}): {cause}",
                details={**error_details(self.url, None, cause), "endpoint": self.endpoint},
            )
        try:
            # Reads, lists and deletes: obstore retries them within the budget. Conditional
            # puts: not retried by obstore (our loop does, knowing which try was in doubt).
            self._store = _build(self.location, self.budget)
            self._put_store = _build(self.location, self.budget, retries=0)
        except (BaseError, ValueError, OSError) as exc:
            cause = scrub(short_cause(exc), credential_values())
            raise PipelineError(
                ErrorCode.STORAGE_CONFIG,
                f"cannot open storage {self.url}: the environment does not configure a "
                f"{BUCKET_NAMES[self.location.scheme]} client ({cause})",
                details=error_details(self.url, None, cause),
            ) from None

    @property
    def url(self) -> str:
        return self.location.url

    @property
    def is_local(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"ObjectStorage({self.url!r})"

    # -- the contract ------------------------------------------------------------------

    def get(self, key: str) -> bytes:
        validate_key(key, storage=self.url)
        try:
            return bytes(obstore.get(self._store, key).bytes())
        except FileNotFoundError as exc:
            self._failures.check_bucket(exc, key, "reading")
            raise self._failures.missing(key, exc) from None
        except BACKEND_ERRORS as exc:
            raise self._failures.failure(exc, key, "reading") from None

    def head(self, key: str) -> ObjectMeta | None:
        validate_key(key, storage=self.url)
        try:
            meta = self._meta(obstore.head(self._store, key))
        except FileNotFoundError as exc:
            self._failures.check_bucket(exc, key, "reading")
            self._probe_bucket(key)  # a HEAD's 404 has no body to tell bucket from object
            return None
        except BACKEND_ERRORS as exc:
            raise self._failures.failure(exc, key, "reading") from None
        self._bucket_seen = True
        return meta

    def put_create(self, key: str, data: bytes) -> ObjectMeta:
        """``If-None-Match: *``: the bucket refuses the put if the key exists."""
        validate_key(key, storage=self.url)
        try:
            result = self._put(key, data, "create")
        except _Refusal as refusal:
            exc = refusal.error
            self._failures.check_bucket(exc, key, "writing")
            if isinstance(exc, FileNotFoundError):
                raise self._failures.failure(exc, key, "writing") from None
            if refusal.in_doubt and (ours := self._ours(key, data)) is not None:
                return ours  # a try in doubt had landed: the object is our own bytes
            raise self._failures.exists(key, exc) from None
        except BACKEND_ERRORS as exc:
            raise self._failures.failure(exc, key, "writing") from None
        return ObjectMeta(key, len(data), _quoted(result["e_tag"]), result["version"], None)

    def put_if_match(self, key: str, data: bytes, expected: ObjectMeta) -> ObjectMeta:
        """``If-Match: <e_tag>`` (and the version, on a versioned bucket)."""
        validate_key(key, storage=self.url)
        if expected.key != key:
            raise self._failures.precondition(
                key, expected, f"the expected version is of {expected.key!r}"
            )
        if expected.e_tag is None and expected.version is None:
            raise self._failures.precondition(key, expected, "the expected version names no e_tag")
        mode: UpdateVersion = {}
        if expected.e_tag is not None:
            mode["e_tag"] = expected.e_tag
        if expected.version is not None:
            mode["version"] = expected.version
        try:
            result = self._put(key, data, mode)
        except _Refusal as refusal:
            exc = refusal.error
            self._failures.check_bucket(exc, key, "writing")
            if refusal.in_doubt and (ours := self._ours(key, data)) is not None:
                return ours  # a try in doubt had landed: the object is our own bytes
            # The object changed or is gone: either way it is not the version expected.
            raise self._failures.precondition(key, expected, self._failures.cause(exc)) from None
        except BACKEND_ERRORS as exc:
            raise self._failures.failure(exc, key, "writing") from None
        return ObjectMeta(key, len(data), _quoted(result["e_tag"]), result["version"], None)

    def list(self, prefix: str = "") -> Iterator[ObjectMeta]:
        """Every object below ``prefix``; a foreign key is skipped and reported (module
        docstring), never fatal."""
        if prefix != "":  # "" is the whole storage; validated now, not at the first next()
            validate_key(prefix, storage=self.url, what="prefix")
        return self._list(prefix, None, set())

    def delete(self, key: str) -> None:
        """Remove the object (gc only); a missing one is not an error (S3 cannot tell)."""
        validate_key(key, storage=self.url)
        try:
            obstore.delete(self._store, key)
        except FileNotFoundError as exc:
            self._failures.check_bucket(exc, key, "deleting")
            return
        except BACKEND_ERRORS as exc:
            raise self._failures.failure(exc, key, "deleting") from None

    # -- conditional puts under retry ----------------------------------------------------

    def _put(self, key: str, data: bytes, mode: "PutMode") -> "PutResult":
        """One conditional put, retried through transient failures within the budget.

        A refusal of the bucket (exists, precondition, not found) is raised as a
        ``_Refusal`` saying whether an earlier try was in doubt (it may have landed).
        """
        started = time.monotonic()
        doubt = False
        attempt = 0
        while True:
            try:
                return obstore.put(self._put_store, key, data, mode=mode)
            except (AlreadyExistsError, PreconditionError, FileNotFoundError) as exc:
                raise _Refusal(exc, doubt) from None
            except BACKEND_ERRORS as exc:
                if not transient(exc):
                    raise
                delay = backoff(attempt)
                attempt += 1
                if attempt > self.budget.max_retries or (
                    time.monotonic() - started + delay > self.budget.budget_s
                ):
                    raise
                doubt = doubt or in_doubt(exc)
                _log.info(
                    "storage %s: retrying a put of %r in %.2f s after %s",
                    self.url,
                    key,
                    delay,
                    self._failures.cause(exc),
                )
                time.sleep(delay)

    def _ours(self, key: str, data: bytes) -> ObjectMeta | None:
        """The stored object's version if it holds exactly ``data`` (a try of ours landed)."""
        try:
            found = obstore.get(self._store, key)
            stored = bytes(found.bytes())
        except BACKEND_ERRORS:
            return None
        if stored != data:
            return None
        meta = found.meta
        return ObjectMeta(key, meta["size"], _quoted(meta["e_tag"]), meta["version"], None)

    # -- listing, foreign keys skipped ---------------------------------------------------

    def _list(self, prefix: str, offset: str | None, seen: set[str]) -> Iterator[ObjectMeta]:
        """Objects under ``prefix`` after ``offset``, each once (``seen``).

        obstore fails a whole page on one key it cannot parse. The listing then resumes
        just after that key (its successor probed by a HEAD), and the objects of the failed
        page that sort before it are listed again through the subtrees of its parents.
        """
        while True:
            last = offset
            try:
                for batch in obstore.list(self._store, prefix=prefix or None, offset=offset):
                    for item in batch:
                        meta = self._meta(item)
                        last = meta.key
                        if meta.key not in seen:
                            seen.add(meta.key)
                            yield meta
                return
            except InvalidPathError as exc:
                bad = self._foreign(exc, prefix)
            except FileNotFoundError as exc:
                self._failures.check_bucket(exc, prefix or "(all)", "listing")
                raise self._failures.failure(exc, prefix or "(all)", "listing") from None
            except BACKEND_ERRORS as exc:
                raise self._failures.failure(exc, prefix or "(all)", "listing") from None
            yield from self._relist_before(prefix, last, bad, seen)
            resume = resume_after(bad)
            if resume is None or (offset is not None and resume <= offset):
                raise self._failures.foreign_failure(bad, prefix)
            found = self._head_quiet(resume)
            if found is not None and found.key not in seen:
                seen.add(found.key)
                yield found
            offset = resume

    def _relist_before(
        self, prefix: str, last: str | None, bad: str, seen: set[str]
    ) -> Iterator[ObjectMeta]:
        """The objects between ``last`` and ``bad`` that a failed page held, through the
        children of each parent of ``bad`` below ``prefix``."""
        parts = bad.split("/")
        depth = len(prefix.split("/")) if prefix else 0
        for level in range(depth, len(parts) - 1 + 1):
            parent = "/".join(parts[:level])
            try:
                listed = obstore.list_with_delimiter(self._store, parent or None)
            except InvalidPathError as exc:
                self._incomplete(parent, bad, exc)
                return
            except BACKEND_ERRORS as exc:
                raise self._failures.failure(exc, parent or "(all)", "listing") from None
            for item in listed["objects"]:
                meta = self._meta(item)
                if meta.key not in seen:
                    seen.add(meta.key)
                    yield meta
            on_path = "/".join(parts[: level + 1])
            for child in listed["common_prefixes"]:
                child = child.rstrip("/")
                if child == on_path or not child + "/" < bad:
                    continue
                if last is not None and last >= child + "0":  # all of it was listed
                    continue
                after = last if last is not None and last.startswith(child + "/") else None
                yield from self._list(child, after, seen)
            if poisoned(on_path + "/"):
                return

    def _head_quiet(self, key: str) -> ObjectMeta | None:
        try:
            return self._meta(obstore.head(self._store, key))
        except FileNotFoundError:
            return None
        except BACKEND_ERRORS as exc:
            raise self._failures.failure(exc, key, "reading") from None

    def _foreign(self, exc: InvalidPathError, prefix: str) -> str:
        """The foreign key ``exc`` names (relative to the storage), reported once."""
        full = bad_key(exc)
        base = f"{self.location.prefix}/" if self.location.prefix else ""
        if full is None or not full.startswith(base) or full == base:
            raise self._failures.failure(exc, prefix or "(all)", "listing") from None
        reason = self._failures.cause(exc).split(" whilst ", 1)[0]
        with self._lock:
            first = full not in self._reported
            self._reported.add(full)
            self.foreign_keys[full] = reason
        if first:
            _log.warning(
                "skipped a foreign object %r in %s: obstore cannot parse its key (%s); it is "
                "none of ours and is left as it is (rename or remove it)",
                full,
                self._failures.where(),
                reason,
            )
        return full[len(base) :]

    def _incomplete(self, parent: str, bad: str, exc: BaseException) -> None:
        note = f"incomplete:{parent}:{bad}"
        with self._lock:
            first = note not in self._reported
            self._reported.add(note)
        if first:
            _log.warning(
                "listing %s: objects directly under %r sorting before %r may be left out "
                "(a key there cannot be parsed: %s)",
                self._failures.where(),
                parent or "(root)",
                bad,
                self._failures.cause(exc),
            )

    # -- helpers -----------------------------------------------------------------------

    @staticmethod
    def _meta(item: "ObstoreMeta") -> ObjectMeta:
        return ObjectMeta(
            key=item["path"],
            size=item["size"],
            e_tag=_quoted(item["e_tag"]),
            version=item["version"],
            last_modified=item["last_modified"],
        )

    def _probe_bucket(self, key: str) -> None:
        """Once per storage: make sure the bucket exists (one LIST of a key nobody has)."""
        if self._bucket_seen:
            return
        try:
            for _ in obstore.list(self._store, prefix=f"{TEMP_PREFIX}probe"):
                break
        except BACKEND_ERRORS as exc:
            self._failures.check_bucket(exc, key, "reading")
            raise self._failures.failure(exc, key, "reading") from None
        self._bucket_seen = True


class _Refusal(Exception):
    """The bucket refused a conditional put; ``in_doubt``: an earlier try may have landed."""

    def __init__(self, error: BaseException, in_doubt: bool) -> None:
        super().__init__(str(error))
        self.error = error
        self.in_doubt = in_doubt
