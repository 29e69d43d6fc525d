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
"""

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import obstore
from obstore.exceptions import (
    AlreadyExistsError,
    BaseError,
    NotSupportedError,
    PermissionDeniedError,
    PreconditionError,
    UnauthenticatedError,
    UnknownConfigurationKeyError,
)
from obstore.store import AzureStore, GCSStore, S3Store

from pipeline_defs.resume.errors import ErrorCode, PipelineError
from resources.storage.base import (
    ObjectMeta,
    error_details,
    mask_url,
    scrub,
    short_cause,
    validate_key,
)

if TYPE_CHECKING:
    from obstore import ObjectMeta as ObstoreMeta
    from obstore import UpdateVersion

SCHEMES = ("s3", "gs", "az")
_NAMES = {"s3": "S3 bucket", "gs": "GCS bucket", "az": "Azure container"}
# Bucket and container names of the three clouds (a superset: the cloud has the last word).
_BUCKET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{1,254}$")
# Environment variables whose values are credentials, cut out of any error text.
_CREDENTIAL_SOURCES = ("AWS_", "AZURE_", "GOOGLE_", "GCS_", "OBJECT_STORE_")
_CREDENTIAL_NAME = re.compile(r"SECRET|TOKEN|PASSWORD|ACCESS_KEY|ACCOUNT_KEY|SAS|CREDENTIAL")
# What S3 and Azure answer when the bucket or container itself is missing.
_NO_BUCKET = ("NoSuchBucket", "ContainerNotFound")
# Failures of a backend that no code below types: the endpoint failed or refused us.
_BACKEND_ERRORS = (BaseError, OSError)


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
    if scheme not in SCHEMES:
        raise _invalid_url(shown, f"the scheme {parts.scheme!r} is not one of {SCHEMES}")
    if "@" in parts.netloc or parts.password is not None:
        raise _invalid_url(
            shown, "credentials in the URL are refused: give them in the environment"
        )
    if parts.query or parts.fragment:
        raise _invalid_url(shown, "a query or fragment is refused: configure the environment")
    if port is not None:
        raise _invalid_url(shown, "a port is refused: set the endpoint in the environment")
    if not _BUCKET.match(parts.netloc):
        raise _invalid_url(shown, f"{parts.netloc!r} is not a {_NAMES[scheme]} name")
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


# The variable that lets each client talk plain HTTP, and where its endpoint is set.
_ALLOW_HTTP = {
    "s3": ("AWS_ALLOW_HTTP", ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT")),
    "az": ("AZURE_ALLOW_HTTP", ("AZURE_STORAGE_ENDPOINT", "AZURE_ENDPOINT")),
}


def _http_hint(scheme: str) -> str:
    """What to set when the endpoint is ``http://`` and the client may not use HTTP (any
    local S3 or azurite): the client's own error says only "builder error"."""
    if scheme not in _ALLOW_HTTP:
        return ""
    allow, endpoints = _ALLOW_HTTP[scheme]
    endpoint = next((os.environ[n] for n in endpoints if os.environ.get(n)), "")
    allowed = os.environ.get(allow, "").strip().lower() in ("true", "1", "yes")
    if not endpoint.lower().startswith("http://") or allowed:
        return ""
    return f"; the endpoint is plain http:// and {allow} is not set: set {allow}=true"


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


def _build(location: BucketLocation) -> S3Store | GCSStore | AzureStore:
    prefix = location.prefix or None
    if location.scheme == "s3":
        return S3Store(location.bucket, prefix=prefix)
    if location.scheme == "gs":
        return GCSStore(location.bucket, prefix=prefix)
    return AzureStore(container_name=location.bucket, prefix=prefix)


class ObjectStorage:
    """Objects in a bucket (see the module docstring for the guarantees)."""

    def __init__(self, url: str) -> None:
        self.location = parse_bucket_url(url)
        # Read when the storage is opened (never at import): for naming it in errors.
        self.endpoint = _endpoint_host(self.location.scheme)
        self._http_hint = _http_hint(self.location.scheme)
        try:
            self._store = _build(self.location)
        except (BaseError, ValueError, OSError) as exc:
            cause = scrub(short_cause(exc), _credential_values())
            raise PipelineError(
                ErrorCode.STORAGE_CONFIG,
                f"cannot open storage {self.url}: the environment does not configure a "
                f"{_NAMES[self.location.scheme]} client ({cause})",
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
            raise self._missing(key, exc) from None
        except _BACKEND_ERRORS as exc:
            raise self._failure(exc, key, "reading") from None

    def head(self, key: str) -> ObjectMeta | None:
        validate_key(key, storage=self.url)
        try:
            return self._meta(obstore.head(self._store, key))
        except FileNotFoundError:
            return None
        except _BACKEND_ERRORS as exc:
            raise self._failure(exc, key, "reading") from None

    def put_create(self, key: str, data: bytes) -> ObjectMeta:
        """``If-None-Match: *``: the bucket refuses the put if the key exists."""
        validate_key(key, storage=self.url)
        try:
            result = obstore.put(self._store, key, data, mode="create")
        except (AlreadyExistsError, PreconditionError) as exc:
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
            result = obstore.put(self._store, key, data, mode=mode)
        except (PreconditionError, FileNotFoundError, AlreadyExistsError) as exc:
            # The object changed or is gone: either way it is not the version expected.
            cause = scrub(short_cause(exc), _credential_values())
            raise self._precondition(key, expected, cause) from None
        except _BACKEND_ERRORS as exc:
            raise self._failure(exc, key, "writing") from None
        return ObjectMeta(key, len(data), _quoted(result["e_tag"]), result["version"], None)

    def list(self, prefix: str = "") -> Iterator[ObjectMeta]:
        if prefix != "":  # "" is the whole storage; validated now, not at the first next()
            validate_key(prefix, storage=self.url, what="prefix")
        return self._list(prefix)

    def delete(self, key: str) -> None:
        """Remove the object (gc only); a missing one is not an error (S3 cannot tell)."""
        validate_key(key, storage=self.url)
        try:
            obstore.delete(self._store, key)
        except FileNotFoundError:
            return
        except _BACKEND_ERRORS as exc:
            raise self._failure(exc, key, "deleting") from None

    # -- helpers -----------------------------------------------------------------------

    def _list(self, prefix: str) -> Iterator[ObjectMeta]:
        try:
            for batch in obstore.list(self._store, prefix=prefix or None):
                for item in batch:
                    yield self._meta(item)
        except _BACKEND_ERRORS as exc:
            raise self._failure(exc, prefix or "(all)", "listing") from None

    @staticmethod
    def _meta(item: "ObstoreMeta") -> ObjectMeta:
        return ObjectMeta(
            key=item["path"],
            size=item["size"],
            e_tag=_quoted(item["e_tag"]),
            version=item["version"],
            last_modified=item["last_modified"],
        )

    def _where(self) -> str:
        return (
            f"storage {self.url} (endpoint {self.endpoint}, "
            f"{_NAMES[self.location.scheme]} {self.location.bucket})"
        )

    def _no_bucket(self, exc: BaseException, key: str) -> PipelineError | None:
        """The bucket (or container) itself is missing: said so, without the XML."""
        text = str(exc)
        if not any(marker in text for marker in _NO_BUCKET):
            return None
        what = _NAMES[self.location.scheme]
        cause = f"the {what} {self.location.bucket} does not exist at {self.endpoint}"
        return PipelineError(
            ErrorCode.STORAGE_UNAVAILABLE,
            f"{self._where()}: {cause}; create it, or name another in PIPELINE_STORAGE_URL",
            details={**error_details(self.url, key, cause), "endpoint": self.endpoint},
        )

    def _failure(self, exc: BaseException, key: str, action: str) -> PipelineError:
        """A backend failure nobody typed above: refused credentials, or unavailable."""
        missing = self._no_bucket(exc, key)
        if missing is not None:
            return missing
        cause = scrub(short_cause(exc), _credential_values())
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
        return PipelineError(
            ErrorCode.STORAGE_UNAVAILABLE,
            f"{self._where()} failed {action} key {key!r}: {cause}{self._http_hint}",
            details=details,
        )

    def _missing(self, key: str, exc: BaseException) -> PipelineError:
        missing = self._no_bucket(exc, key)
        if missing is not None:
            return missing
        cause = scrub(short_cause(exc), _credential_values())
        return PipelineError(
            ErrorCode.STORAGE_OBJECT_MISSING,
            f"no object {key!r} in {self._where()}: {cause}",
            details=error_details(self.url, key, cause),
        )

    def _exists(self, key: str, exc: BaseException) -> PipelineError:
        cause = scrub(short_cause(exc), _credential_values())
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
