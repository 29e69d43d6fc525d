"""Where a bucket storage is: its URL parsed and checked (``scheme://bucket[/prefix]``), and
the endpoint its client will talk to, named from the environment for error messages.

The URL carries the scheme, the bucket (or Azure container) and the key prefix only:
credentials, options and ports belong in the environment and are refused in the URL.
"""

import os
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from pipeline_defs.resume.errors import ErrorCode, PipelineError
from resources.storage.base import mask_url, validate_key

# The schemes a bucket storage (obstore's clients) speaks, and what each names. Each is also
# a storage scheme (``STORAGE_SCHEMES``, with its module in ``resources/storage/schemes/``).
BUCKET_NAMES = {"s3": "S3 bucket", "gs": "GCS bucket", "az": "Azure container"}
BUCKET_SCHEMES = tuple(BUCKET_NAMES)
# Bucket and container names of the three clouds (a superset: the cloud has the last word).
_BUCKET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{1,254}$")
_TRUE = ("1", "true", "yes", "on", "y")
# scheme -> the variable that lets obstore talk plain HTTP to that cloud's endpoint.
ALLOW_HTTP = {"s3": "AWS_ALLOW_HTTP", "gs": "GOOGLE_ALLOW_HTTP", "az": "AZURE_ALLOW_HTTP"}


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


def endpoint_host(scheme: str) -> str:
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


def http_endpoint(scheme: str) -> str | None:
    """The variable naming the endpoint when it is plain ``http://`` (S3 only; else None)."""
    if scheme != "s3":
        return None
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT"):
        value = os.environ.get(name, "").strip()
        if value:
            return name if value.lower().startswith("http://") else None
    return None


def allows_http(scheme: str) -> bool:
    """Whether the environment lets the scheme's client talk plain HTTP."""
    return os.environ.get(ALLOW_HTTP[scheme], "").strip().lower() in _TRUE
