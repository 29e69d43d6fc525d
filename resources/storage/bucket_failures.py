"""What a bucket storage's failures say: each names the storage, its endpoint and bucket,
and the backend's cause scrubbed of credentials (:mod:`~resources.storage.backend_errors`);
each is the :class:`PipelineError` of its code (a missing bucket, object or version, a
refusal of the credentials, a configuration the backend cannot do, an unavailable store).

:class:`~resources.storage.object_store.ObjectStorage` holds one per storage.
"""

from dataclasses import dataclass

from obstore.exceptions import (
    NotSupportedError,
    PermissionDeniedError,
    UnauthenticatedError,
    UnknownConfigurationKeyError,
)

from pipeline_defs.resume.errors import ErrorCode, PipelineError
from resources.storage.backend_errors import backend_cause, says_bucket_missing
from resources.storage.base import ObjectMeta, error_details
from resources.storage.bucket_location import BUCKET_NAMES, BucketLocation
from resources.storage.retry_budget import RetryBudget, transient


@dataclass(frozen=True)
class BucketFailures:
    """The failures of one bucket storage, in words safe to show."""

    location: BucketLocation
    endpoint: str
    budget: RetryBudget

    @property
    def url(self) -> str:
        return self.location.url

    def cause(self, exc: BaseException) -> str:
        """The backend's one-line cause, scrubbed (:func:`backend_cause`)."""
        return backend_cause(exc, timeout_s=self.budget.timeout_s)

    def foreign_failure(self, bad: str, prefix: str) -> PipelineError:
        cause = f"the listing cannot get past the foreign key {bad!r} (rename or remove it)"
        return PipelineError(
            ErrorCode.STORAGE_UNAVAILABLE,
            f"{self.where()} failed listing key {prefix or '(all)'!r}: {cause}",
            details={
                **error_details(self.url, prefix or "(all)", cause),
                "endpoint": self.endpoint,
            },
        )

    def check_bucket(self, exc: BaseException, key: str, action: str) -> None:
        """Raise ``storage.bucket_missing`` if ``exc`` says the bucket does not exist."""
        if not says_bucket_missing(exc):
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

    def where(self) -> str:
        return (
            f"storage {self.url} (endpoint {self.endpoint}, "
            f"{BUCKET_NAMES[self.location.scheme]} {self.location.bucket})"
        )

    def failure(self, exc: BaseException, key: str, action: str) -> PipelineError:
        """A backend failure nobody typed above: refused credentials, or unavailable."""
        self.check_bucket(exc, key, action)  # raises storage.bucket_missing
        cause = self.cause(exc)
        details = {**error_details(self.url, key, cause), "endpoint": self.endpoint}
        if isinstance(exc, PermissionDeniedError | UnauthenticatedError | PermissionError):
            return PipelineError(
                ErrorCode.STORAGE_PERMISSION_DENIED,
                f"{self.where()} refused {action} key {key!r}: {cause}; check the "
                "credentials in the environment",
                details=details,
            )
        if isinstance(exc, NotSupportedError | UnknownConfigurationKeyError):
            return PipelineError(
                ErrorCode.STORAGE_CONFIG,
                f"{self.where()} cannot do {action} key {key!r} as configured: {cause}",
                details=details,
            )
        retried = f"; {self.budget.describe()}" if transient(exc) else ""
        return PipelineError(
            ErrorCode.STORAGE_UNAVAILABLE,
            f"{self.where()} failed {action} key {key!r}: {cause}{retried}",
            details={
                **details,
                "timeout_s": self.budget.timeout_s,
                "retries": self.budget.retries,
                "budget_s": self.budget.budget_s,
            },
        )

    def missing(self, key: str, exc: BaseException) -> PipelineError:
        cause = self.cause(exc)
        return PipelineError(
            ErrorCode.STORAGE_OBJECT_MISSING,
            f"no object {key!r} in {self.where()}: {cause}",
            details=error_details(self.url, key, cause),
        )

    def exists(self, key: str, exc: BaseException) -> PipelineError:
        cause = self.cause(exc)
        return PipelineError(
            ErrorCode.STORAGE_OBJECT_EXISTS,
            f"object {key!r} already exists in storage {self.url} and objects are "
            f"create-only: it was left as it is ({cause})",
            details=error_details(self.url, key, cause),
        )

    def precondition(self, key: str, expected: ObjectMeta, cause: str) -> PipelineError:
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
