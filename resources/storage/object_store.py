"""The storage contract on a bucket: S3, Google Cloud Storage or Azure Blob, via obstore.

``s3://bucket/prefix``, ``gs://bucket/prefix``, ``az://container/prefix``: the prefix (if
any) is joined to every key, so one bucket can hold several pipeline homes. Credentials,
region and endpoint come only from the environment or the platform (``AWS_*``,
``GOOGLE_APPLICATION_CREDENTIALS``, ``AZURE_STORAGE_*``, instance roles), read by obstore
when the storage is opened — never from the URL (one with a user part or a query is
refused) and never written anywhere. Errors name the endpoint host and the bucket, and
every credential value the process holds is cut out of a backend's error text.

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
import math
import os
import random
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, TypeVar
from urllib.parse import urlsplit

import obstore
from obstore.exceptions import (
    AlreadyExistsError,
    BaseError,
    InvalidPathError,
    NotSupportedError,
    PermissionDeniedError,
    PreconditionError,
    UnauthenticatedError,
    UnknownConfigurationKeyError,
)
from obstore.store import AzureStore, GCSStore, S3Store

from pipeline_defs.resume.errors import ErrorCode, PipelineError
from pipeline_defs.resume.settings import BUCKET_SCHEMES
from resources.storage.base import (
    TEMP_PREFIX,
    ObjectMeta,
    error_details,
    mask_url,
    scrub,
    short_cause,
    validate_key,
)

if TYPE_CHECKING:
    from obstore import ObjectMeta as ObstoreMeta
    from obstore import PutMode, PutResult, UpdateVersion
    from obstore.store import ClientConfig, RetryConfig

_log = logging.getLogger(__name__)
_T = TypeVar("_T")

# What each scheme of the one list (``BUCKET_SCHEMES``, which the settings check too) names.
BUCKET_NAMES = {"s3": "S3 bucket", "gs": "GCS bucket", "az": "Azure container"}
# Bucket and container names of the three clouds (a superset: the cloud has the last word).
_BUCKET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{1,254}$")
# Environment variables whose values are credentials, cut out of any error text.
_CREDENTIAL_SOURCES = ("AWS_", "AZURE_", "GOOGLE_", "GCS_", "OBJECT_STORE_")
_CREDENTIAL_NAME = re.compile(r"SECRET|TOKEN|PASSWORD|ACCESS_KEY|ACCOUNT_KEY|SAS|CREDENTIAL")
# Failures of a backend that no code below types: the endpoint failed or refused us.
_BACKEND_ERRORS = (BaseError, OSError)
# What a backend says of a bucket or container that does not exist (S3/GCS XML, GCS JSON,
# Azure): never to be read as a missing object.
_NO_BUCKET = re.compile(
    r"NoSuchBucket|ContainerNotFound|The specified bucket does not exist", re.IGNORECASE
)
# An XML error body of a backend: shown as its code and message, never raw.
_XML_ERROR = re.compile(r"(?:<\?xml[^>]*\?>\s*)?<Error>(.*?)(?:</Error>|$)", re.DOTALL)
_XML_FIELD = re.compile(r"<(Code|Message)>(.*?)</\1>", re.DOTALL)
# obstore 0.12's error text (its debug part) says what failed: an HTTP status, or the kind
# of transport error. Connect: nothing was sent; the others may have reached the store.
_STATUS = re.compile(r"\bstatus: (\d{3})\b")
_HTTP_KIND = re.compile(r"HttpError \{\s*kind: (\w+)")
_TRANSIENT_KINDS = frozenset({"Connect", "Request", "Timeout", "Interrupted", "Decode"})
_TRANSIENT_STATUS = frozenset({408, 429})
# The bad key of an InvalidPathError (its debug part, Rust-escaped).
_BAD_PATH = re.compile(r'path: "((?:[^"\\]|\\.)*)"')
_RUST_ESCAPE = re.compile(r"\\(u\{([0-9a-fA-F]+)\}|.)")
_OS_MESSAGE = re.compile(r'message: "([^"]{1,200})"')
_TRUE = ("1", "true", "yes", "on", "y")
# scheme -> the variable that lets obstore talk plain HTTP to that cloud's endpoint.
_ALLOW_HTTP = {"s3": "AWS_ALLOW_HTTP", "gs": "GOOGLE_ALLOW_HTTP", "az": "AZURE_ALLOW_HTTP"}
_INIT_BACKOFF_S = 0.1
_MAX_BACKOFF_S = 15.0
_UNCOUNTED = 1_000_000  # "no count": the budget in seconds ends the retries first


@dataclass(frozen=True)
class RetryBudget:
    """How long a bucket storage keeps trying through transient failures."""

    timeout_s: float = 30.0
    # No count of its own by default: an outage is waited out by time, within ``budget_s``
    # (ten quick retries of a refused connection were spent in seconds, and a step that
    # had paid failed in a one-minute outage). ``PIPELINE_STORAGE_RETRIES`` caps it.
    retries: int | None = None
    budget_s: float = 120.0

    ENV = {
        "timeout_s": "PIPELINE_STORAGE_TIMEOUT_SECONDS",
        "retries": "PIPELINE_STORAGE_RETRIES",
        "budget_s": "PIPELINE_STORAGE_RETRY_BUDGET_SECONDS",
    }

    @classmethod
    def from_env(cls, storage: str) -> "RetryBudget":
        """The budget the ``PIPELINE_STORAGE_*`` variables set (read when opening)."""
        values: dict[str, float | int] = {}
        for field, name in cls.ENV.items():
            text = os.environ.get(name, "").strip()
            if not text:
                continue
            try:
                value = int(text) if field == "retries" else float(text)
            except ValueError:
                value = -1
            low = 0 if field == "retries" else 0.001
            if not (math.isfinite(value) and low <= value <= 86_400):
                cause = (
                    f"{name}={text!r} is not a number of {field.split('_')[0]} in [{low}, 86400]"
                )
                raise PipelineError(
                    ErrorCode.STORAGE_CONFIG,
                    f"cannot open storage {storage}: {cause}",
                    details=error_details(storage, None, cause),
                )
            values[field] = value
        return cls(**values)  # type: ignore[arg-type]

    @property
    def max_retries(self) -> int:
        """The count obstore and the put loop stop at: the cap, or none but the budget."""
        return _UNCOUNTED if self.retries is None else self.retries

    def describe(self) -> str:
        tries = "with no count limit" if self.retries is None else f"up to {self.retries} retries"
        return (
            f"transient errors were retried {tries} within a budget "
            f"of {_secs(self.budget_s)}, each request timing out after "
            f"{_secs(self.timeout_s)} ({self.ENV['retries']}, {self.ENV['budget_s']}, "
            f"{self.ENV['timeout_s']})"
        )

    def client_options(self, allow_http: bool) -> "ClientConfig":
        options: ClientConfig = {
            "timeout": timedelta(seconds=self.timeout_s),
            "connect_timeout": timedelta(seconds=min(5.0, self.timeout_s)),
        }
        if allow_http:  # given options replace the environment's: keep its AWS_ALLOW_HTTP
            options["allow_http"] = True
        return options

    def retry_config(self, retries: int | None = None) -> "RetryConfig":
        return {
            "max_retries": self.max_retries if retries is None else retries,
            "retry_timeout": timedelta(seconds=self.budget_s),
            "backoff": {
                "init_backoff": timedelta(seconds=_INIT_BACKOFF_S),
                "max_backoff": timedelta(seconds=min(_MAX_BACKOFF_S, self.budget_s)),
                "base": 2,
            },
        }


def _secs(value: float) -> str:
    return f"{value:g} s"


@dataclass(frozen=True)
class BucketLocation:
    """A parsed bucket URL: scheme, bucket (or Azure container) and key prefix."""

    scheme: str
    bucket: str
    prefix: str

    @property
    def url(self) -> str:
        """The display form: nothing but scheme, bucket and prefix (nothing secret)."""
        base = f"{self.scheme}://{self.bucket}"
        return f"{base}/{self.prefix}" if self.prefix else base


def parse_bucket_url(url: str) -> BucketLocation:
    """``scheme://bucket[/prefix]`` of a supported scheme, else ``storage.invalid_url``.

    Credentials in the URL (a user part) and options (a query) are refused: both belong
    in the environment, where they are neither logged nor shown.
    """
    shown = mask_url(url)
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise _invalid_url(shown, f"it cannot be parsed ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in BUCKET_SCHEMES:
        raise _invalid_url(shown, f"the scheme {parts.scheme!r} is not one of {BUCKET_SCHEMES}")
    if "@" in parts.netloc or parts.password is not None:
        raise _invalid_url(
            shown, "credentials in the URL are refused: give them in the environment"
        )
    if parts.query or parts.fragment:
        raise _invalid_url(shown, "a query or fragment is refused: configure the environment")
    if port is not None:
        raise _invalid_url(shown, "a port is refused: set the endpoint in the environment")
    if not _BUCKET.match(parts.netloc):
        raise _invalid_url(shown, f"{parts.netloc!r} is not a {BUCKET_NAMES[scheme]} name")
    prefix = parts.path.strip("/")
    if prefix:
        try:
            validate_key(prefix, storage=shown, what="prefix")
        except PipelineError as exc:
            raise _invalid_url(shown, f"the prefix is invalid: {exc.details['cause']}") from None
    return BucketLocation(scheme=scheme, bucket=parts.netloc, prefix=prefix)


def _invalid_url(shown: str, cause: str) -> PipelineError:
    return PipelineError(
        ErrorCode.STORAGE_INVALID_URL,
        f"invalid storage URL {shown}: {cause}",
        details={"url": shown, "cause": cause},
    )


def _credential_values() -> list[str]:
    """The values of the credential variables set now (read at error time, never stored)."""
    return [
        value
        for name, value in os.environ.items()
        if value
        and name.upper().startswith(_CREDENTIAL_SOURCES)
        and _CREDENTIAL_NAME.search(name.upper())
    ]


def _endpoint_host(scheme: str) -> str:
    """The endpoint host[:port] the client will talk to, as configured (no user part)."""
    env = os.environ
    if scheme == "s3":
        for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT"):
            if env.get(name):
                try:
                    host = urlsplit(env[name]).netloc.rsplit("@", 1)[-1]
                except ValueError:
                    host = ""
                return host or f"({name} is set)"
        region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1"
        return f"s3.{region}.amazonaws.com"
    if scheme == "gs":
        return "storage.googleapis.com"
    for name in ("AZURE_STORAGE_ENDPOINT", "AZURE_ENDPOINT"):
        if env.get(name):
            return _host_of(env[name], name)
    if env.get("AZURE_STORAGE_USE_EMULATOR", "").lower() in ("1", "true"):
        return _host_of(env.get("AZURITE_BLOB_STORAGE_URL") or "http://127.0.0.1:10000", "")
    account = env.get("AZURE_STORAGE_ACCOUNT_NAME") or env.get("AZURE_STORAGE_ACCOUNT")
    return f"{account}.blob.core.windows.net" if account else "the Azure Blob endpoint"


def _host_of(url: str, name: str) -> str:
    """host[:port] of an endpoint URL (never a user part), or which variable sets it."""
    try:
        host = urlsplit(url).netloc.rsplit("@", 1)[-1]
    except ValueError:
        host = ""
    return host or f"({name} is set)"


def _quoted(e_tag: str | None) -> str | None:
    """One form for an e_tag, the quoted one of an HTTP header: Azure's (and GCS's) listings
    give it bare where a HEAD or a PUT gives it quoted, so a listing would otherwise never
    match a manifest (the scrub took every object of an Azure container for changed)."""
    if e_tag is None or e_tag.startswith(('"', 'W/"')):
        return e_tag
    return f'"{e_tag}"'


def _http_endpoint(scheme: str) -> str | None:
    """The configured endpoint URL when it is plain ``http://`` (S3 only; else None)."""
    if scheme != "s3":
        return None
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT"):
        value = os.environ.get(name, "").strip()
        if value:
            return name if value.lower().startswith("http://") else None
    return None


def _allows_http(scheme: str) -> bool:
    return os.environ.get(_ALLOW_HTTP[scheme], "").strip().lower() in _TRUE


def _build(
    location: BucketLocation, budget: RetryBudget, *, retries: int | None = None
) -> S3Store | GCSStore | AzureStore:
    prefix = location.prefix or None
    options = budget.client_options(_allows_http(location.scheme))
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
        self.endpoint = _endpoint_host(self.location.scheme)
        self.budget = RetryBudget.from_env(self.url)
        # Foreign keys met by list (full key in the bucket -> why obstore refused it).
        self.foreign_keys: dict[str, str] = {}
        self._reported: set[str] = set()
        self._bucket_seen = False
        self._lock = threading.Lock()
        variable = _http_endpoint(self.location.scheme)
        if variable is not None and not _allows_http(self.location.scheme):
            cause = (
                f"the endpoint {variable} is http:// and plain HTTP is off: set "
                f"{_ALLOW_HTTP['s3']}=true (a local S3 such as MinIO or moto) or use https://"
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
            cause = scrub(short_cause(exc), _credential_values())
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
            self._check_bucket(exc, key, "reading")
            raise self._missing(key, exc) from None
        except _BACKEND_ERRORS as exc:
            raise self._failure(exc, key, "reading") from None

    def head(self, key: str) -> ObjectMeta | None:
        validate_key(key, storage=self.url)
        try:
            meta = self._meta(obstore.head(self._store, key))
        except FileNotFoundError as exc:
            self._check_bucket(exc, key, "reading")
            self._probe_bucket(key)  # a HEAD's 404 has no body to tell bucket from object
            return None
        except _BACKEND_ERRORS as exc:
            raise self._failure(exc, key, "reading") from None
        self._bucket_seen = True
        return meta

    def put_create(self, key: str, data: bytes) -> ObjectMeta:
        """``If-None-Match: *``: the bucket refuses the put if the key exists."""
        validate_key(key, storage=self.url)
        try:
            result = self._put(key, data, "create")
        except _Refusal as refusal:
            exc = refusal.error
            self._check_bucket(exc, key, "writing")
            if isinstance(exc, FileNotFoundError):
                raise self._failure(exc, key, "writing") from None
            if refusal.in_doubt and (ours := self._ours(key, data)) is not None:
                return ours  # a try in doubt had landed: the object is our own bytes
            raise self._exists(key, exc) from None
        except _BACKEND_ERRORS as exc:
            raise self._failure(exc, key, "writing") from None
        return ObjectMeta(key, len(data), _quoted(result["e_tag"]), result["version"], None)

    def put_if_match(self, key: str, data: bytes, expected: ObjectMeta) -> ObjectMeta:
        """``If-Match: <e_tag>`` (and the version, on a versioned bucket)."""
        validate_key(key, storage=self.url)
        if expected.key != key:
            raise self._precondition(key, expected, f"the expected version is of {expected.key!r}")
        if expected.e_tag is None and expected.version is None:
            raise self._precondition(key, expected, "the expected version names no e_tag")
        mode: UpdateVersion = {}
        if expected.e_tag is not None:
            mode["e_tag"] = expected.e_tag
        if expected.version is not None:
            mode["version"] = expected.version
        try:
            result = self._put(key, data, mode)
        except _Refusal as refusal:
            exc = refusal.error
            self._check_bucket(exc, key, "writing")
            if refusal.in_doubt and (ours := self._ours(key, data)) is not None:
                return ours  # a try in doubt had landed: the object is our own bytes
            # The object changed or is gone: either way it is not the version expected.
            raise self._precondition(key, expected, self._cause(exc)) from None
        except _BACKEND_ERRORS as exc:
            raise self._failure(exc, key, "writing") from None
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
            self._check_bucket(exc, key, "deleting")
            return
        except _BACKEND_ERRORS as exc:
            raise self._failure(exc, key, "deleting") from None

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
            except _BACKEND_ERRORS as exc:
                if not _transient(exc):
                    raise
                delay = _backoff(attempt)
                attempt += 1
                if attempt > self.budget.max_retries or (
                    time.monotonic() - started + delay > self.budget.budget_s
                ):
                    raise
                doubt = doubt or _in_doubt(exc)
                _log.info(
                    "storage %s: retrying a put of %r in %.2f s after %s",
                    self.url,
                    key,
                    delay,
                    self._cause(exc),
                )
                time.sleep(delay)

    def _ours(self, key: str, data: bytes) -> ObjectMeta | None:
        """The stored object's version if it holds exactly ``data`` (a try of ours landed)."""
        try:
            found = obstore.get(self._store, key)
            stored = bytes(found.bytes())
        except _BACKEND_ERRORS:
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
                self._check_bucket(exc, prefix or "(all)", "listing")
                raise self._failure(exc, prefix or "(all)", "listing") from None
            except _BACKEND_ERRORS as exc:
                raise self._failure(exc, prefix or "(all)", "listing") from None
            yield from self._relist_before(prefix, last, bad, seen)
            resume = _resume_after(bad)
            if resume is None or (offset is not None and resume <= offset):
                raise self._foreign_failure(bad, prefix)
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
            except _BACKEND_ERRORS as exc:
                raise self._failure(exc, parent or "(all)", "listing") from None
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
            if _poisoned(on_path + "/"):
                return

    def _head_quiet(self, key: str) -> ObjectMeta | None:
        try:
            return self._meta(obstore.head(self._store, key))
        except FileNotFoundError:
            return None
        except _BACKEND_ERRORS as exc:
            raise self._failure(exc, key, "reading") from None

    def _foreign(self, exc: InvalidPathError, prefix: str) -> str:
        """The foreign key ``exc`` names (relative to the storage), reported once."""
        full = _bad_key(exc)
        base = f"{self.location.prefix}/" if self.location.prefix else ""
        if full is None or not full.startswith(base) or full == base:
            raise self._failure(exc, prefix or "(all)", "listing") from None
        reason = self._cause(exc).split(" whilst ", 1)[0]
        with self._lock:
            first = full not in self._reported
            self._reported.add(full)
            self.foreign_keys[full] = reason
        if first:
            _log.warning(
                "skipped a foreign object %r in %s: obstore cannot parse its key (%s); it is "
                "none of ours and is left as it is (rename or remove it)",
                full,
                self._where(),
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
                self._where(),
                parent or "(root)",
                bad,
                self._cause(exc),
            )

    def _foreign_failure(self, bad: str, prefix: str) -> PipelineError:
        cause = f"the listing cannot get past the foreign key {bad!r} (rename or remove it)"
        return PipelineError(
            ErrorCode.STORAGE_UNAVAILABLE,
            f"{self._where()} failed listing key {prefix or '(all)'!r}: {cause}",
            details={
                **error_details(self.url, prefix or "(all)", cause),
                "endpoint": self.endpoint,
            },
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

    def _cause(self, exc: BaseException) -> str:
        """The backend's one-line cause, an XML body as its code and message, scrubbed."""
        text = _XML_ERROR.sub(_xml_summary, short_cause(exc, limit=4000))
        kind = _HTTP_KIND.search(str(exc))
        if kind is not None and kind.group(1) == "Timeout":
            text += f" (the request timed out after {_secs(self.budget.timeout_s)})"
        elif kind is not None and kind.group(1) == "Connect":
            os_error = _OS_MESSAGE.search(str(exc))
            text += f" (cannot connect: {os_error.group(1) if os_error else 'connect error'})"
        if len(text) > 500:
            text = text[:499] + "…"
        return scrub(text, _credential_values())

    def _probe_bucket(self, key: str) -> None:
        """Once per storage: make sure the bucket exists (one LIST of a key nobody has)."""
        if self._bucket_seen:
            return
        try:
            for _ in obstore.list(self._store, prefix=f"{TEMP_PREFIX}probe"):
                break
        except _BACKEND_ERRORS as exc:
            self._check_bucket(exc, key, "reading")
            raise self._failure(exc, key, "reading") from None
        self._bucket_seen = True

    def _check_bucket(self, exc: BaseException, key: str, action: str) -> None:
        """Raise ``storage.bucket_missing`` if ``exc`` says the bucket does not exist."""
        if not _NO_BUCKET.search(str(exc)):
            return
        what = BUCKET_NAMES[self.location.scheme]
        cause = f"the {what} {self.location.bucket!r} does not exist at {self.endpoint}"
        raise PipelineError(
            ErrorCode.STORAGE_BUCKET_MISSING,
            f"storage {self.url} failed {action} key {key!r}: {cause} (create it, or check "
            "the bucket name in the URL and the endpoint/account in the environment)",
            details={
                **error_details(self.url, key, cause),
                "endpoint": self.endpoint,
                "bucket": self.location.bucket,
            },
        ) from None

    def _where(self) -> str:
        return (
            f"storage {self.url} (endpoint {self.endpoint}, "
            f"{BUCKET_NAMES[self.location.scheme]} {self.location.bucket})"
        )

    def _failure(self, exc: BaseException, key: str, action: str) -> PipelineError:
        """A backend failure nobody typed above: refused credentials, or unavailable."""
        self._check_bucket(exc, key, action)  # raises storage.bucket_missing
        cause = self._cause(exc)
        details = {**error_details(self.url, key, cause), "endpoint": self.endpoint}
        if isinstance(exc, PermissionDeniedError | UnauthenticatedError | PermissionError):
            return PipelineError(
                ErrorCode.STORAGE_PERMISSION_DENIED,
                f"{self._where()} refused {action} key {key!r}: {cause}; check the "
                "credentials in the environment",
                details=details,
            )
        if isinstance(exc, NotSupportedError | UnknownConfigurationKeyError):
            return PipelineError(
                ErrorCode.STORAGE_CONFIG,
                f"{self._where()} cannot do {action} key {key!r} as configured: {cause}",
                details=details,
            )
        retried = f"; {self.budget.describe()}" if _transient(exc) else ""
        return PipelineError(
            ErrorCode.STORAGE_UNAVAILABLE,
            f"{self._where()} failed {action} key {key!r}: {cause}{retried}",
            details={
                **details,
                "timeout_s": self.budget.timeout_s,
                "retries": self.budget.retries,
                "budget_s": self.budget.budget_s,
            },
        )

    def _missing(self, key: str, exc: BaseException) -> PipelineError:
        cause = self._cause(exc)
        return PipelineError(
            ErrorCode.STORAGE_OBJECT_MISSING,
            f"no object {key!r} in {self._where()}: {cause}",
            details=error_details(self.url, key, cause),
        )

    def _exists(self, key: str, exc: BaseException) -> PipelineError:
        cause = self._cause(exc)
        return PipelineError(
            ErrorCode.STORAGE_OBJECT_EXISTS,
            f"object {key!r} already exists in storage {self.url} and objects are "
            f"create-only: it was left as it is ({cause})",
            details=error_details(self.url, key, cause),
        )

    def _precondition(self, key: str, expected: ObjectMeta, cause: str) -> PipelineError:
        return PipelineError(
            ErrorCode.STORAGE_PRECONDITION_FAILED,
            f"object {key!r} in storage {self.url} is not the version expected "
            f"(e_tag {expected.e_tag}, version {expected.version}): nothing was written "
            f"({cause})",
            details={
                **error_details(self.url, key, cause),
                "expected_e_tag": expected.e_tag,
                "expected_version": expected.version,
            },
        )


class _Refusal(Exception):
    """The bucket refused a conditional put; ``in_doubt``: an earlier try may have landed."""

    def __init__(self, error: BaseException, in_doubt: bool) -> None:
        super().__init__(str(error))
        self.error = error
        self.in_doubt = in_doubt


def _transient(exc: BaseException) -> bool:
    """A failure worth another try: a transport error or a 5xx/408/429 answer."""
    text = str(exc)
    status = _STATUS.search(text)
    if status is not None:
        code = int(status.group(1))
        return code >= 500 or code in _TRANSIENT_STATUS
    kind = _HTTP_KIND.search(text)
    return kind is not None and kind.group(1) in _TRANSIENT_KINDS


def _in_doubt(exc: BaseException) -> bool:
    """Whether the failed try may have reached the store (all but a refused connection)."""
    kind = _HTTP_KIND.search(str(exc))
    return not (kind is not None and kind.group(1) == "Connect")


def _backoff(attempt: int) -> float:
    """Exponential backoff with jitter (half to full of 0.1 s x 2^attempt, capped)."""
    ceiling: float = min(_MAX_BACKOFF_S, _INIT_BACKOFF_S * 2.0 ** min(attempt, 30))
    return ceiling * (0.5 + random.random() / 2)


def _xml_summary(match: "re.Match[str]") -> str:
    fields = dict(_XML_FIELD.findall(match.group(1)))
    code, message = fields.get("Code", ""), fields.get("Message", "")
    summary = f"{code} ({message})" if code and message else code or message
    return summary or "an XML error"


def _bad_key(exc: BaseException) -> str | None:
    """The key obstore refused to parse, unescaped from its error's debug text."""
    found = _BAD_PATH.search(str(exc))
    if found is None:
        return None

    def unescape(match: "re.Match[str]") -> str:
        if match.group(2) is not None:
            return chr(int(match.group(2), 16))
        char = match.group(1)
        return {"n": "\n", "t": "\t", "r": "\r", "0": "\0"}.get(char, char)

    return _RUST_ESCAPE.sub(unescape, found.group(1))


def _parses(key: str) -> bool:
    """Whether obstore parses ``key`` as a path (its rules, not our stricter key rules)."""
    return bool(key) and not any(
        part in ("", ".", "..") or _CONTROL_CHAR.search(part) for part in key.split("/")
    )


_CONTROL_CHAR = re.compile(r"[\x00-\x1f\x7f]")


def _poisoned(head: str) -> bool:
    """Whether every key starting with ``head`` is unparseable: a control character, or
    a complete part (one a '/' ends) that is empty, ``.`` or ``..``."""
    if _CONTROL_CHAR.search(head):
        return True
    return any(part in ("", ".", "..") for part in head.split("/")[:-1])


def _resume_after(bad: str) -> str | None:
    """A parseable key to list after that skips ``bad`` and, of the keys just after it,
    only unparseable ones (the key returned itself is probed apart): None if none."""
    for end in range(1, len(bad) + 1):
        if _poisoned(bad[:end]):
            code = ord(bad[end - 1]) + 1
            while _CONTROL_CHAR.match(chr(code)):
                code += 1
            candidate = bad[: end - 1] + chr(code)
            break
    else:
        candidate = bad + " "  # bad + a control character is all that sorts between
    return candidate if _parses(candidate) and candidate > bad else None
