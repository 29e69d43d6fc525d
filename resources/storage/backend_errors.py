"""What a bucket backend's failure says, in words safe to show.

:func:`backend_cause`: the one-line cause of a failure (an XML error body as its code and
message, a timeout or refused connection said as such), with every credential value the
process holds cut out; :func:`says_bucket_missing`: whether the backend says the bucket or
container itself does not exist (never to be read as a missing object).
"""

import os
import re

from obstore.exceptions import BaseError

from resources.storage.base import scrub, short_cause
from resources.storage.retry_budget import secs, transport_kind

# Failures of a backend that no code below types: the endpoint failed or refused us.
BACKEND_ERRORS = (BaseError, OSError)
# Environment variables whose values are credentials, cut out of any error text.
_CREDENTIAL_SOURCES = ("AWS_", "AZURE_", "GOOGLE_", "GCS_", "OBJECT_STORE_")
_CREDENTIAL_NAME = re.compile(r"SECRET|TOKEN|PASSWORD|ACCESS_KEY|ACCOUNT_KEY|SAS|CREDENTIAL")
# What a backend says of a bucket or container that does not exist (S3/GCS XML, GCS JSON,
# Azure): never to be read as a missing object.
_NO_BUCKET = re.compile(
    r"NoSuchBucket|ContainerNotFound|The specified bucket does not exist", re.IGNORECASE
)
# An XML error body of a backend: shown as its code and message, never raw.
_XML_ERROR = re.compile(r"(?:<\?xml[^>]*\?>\s*)?<Error>(.*?)(?:</Error>|$)", re.DOTALL)
_XML_FIELD = re.compile(r"<(Code|Message)>(.*?)</\1>", re.DOTALL)
_OS_MESSAGE = re.compile(r'message: "([^"]{1,200})"')


def credential_values() -> list[str]:
    """The values of the credential variables set now (read at error time, never stored)."""
    return [
        value
        for name, value in os.environ.items()
        if value
        and name.upper().startswith(_CREDENTIAL_SOURCES)
        and _CREDENTIAL_NAME.search(name.upper())
    ]


def backend_cause(exc: BaseException, *, timeout_s: float) -> str:
    """The backend's one-line cause, an XML body as its code and message, scrubbed."""
    text = _XML_ERROR.sub(_xml_summary, short_cause(exc, limit=4000))
    kind = transport_kind(exc)
    if kind == "Timeout":
        text += f" (the request timed out after {secs(timeout_s)})"
    elif kind == "Connect":
        os_error = _OS_MESSAGE.search(str(exc))
        text += f" (cannot connect: {os_error.group(1) if os_error else 'connect error'})"
    if len(text) > 500:
        text = text[:499] + "…"
    return scrub(text, credential_values())


def says_bucket_missing(exc: BaseException) -> bool:
    """Whether ``exc`` says the bucket (or container) itself does not exist."""
    return _NO_BUCKET.search(str(exc)) is not None


def _xml_summary(match: "re.Match[str]") -> str:
    fields = dict(_XML_FIELD.findall(match.group(1)))
    code, message = fields.get("Code", ""), fields.get("Message", "")
    summary = f"{code} ({message})" if code and message else code or message
    return summary or "an XML error"
