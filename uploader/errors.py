"""Upload failures, split by what the caller should do next.

The split matters more than the detail: a retryable error means "try again later, commit nothing",
a fatal one means "a person must change a setting" -- retrying a bad credential can lock an account.
"""

from __future__ import annotations


class UploadError(Exception):
    """Base class so callers can catch every upload failure in one place."""

    retryable: bool = False

    def __init__(self, message: str, *, status: int | None = None, reason: str = "error") -> None:
        super().__init__(message)
        self.status = status  # the HTTP status when the endpoint answered, so callers never parse messages
        self.reason = reason
        self.body: str | None = None  # the endpoint's answer (redacted excerpt), when it gave one


class RetryableUploadError(UploadError):
    """Transient: timeouts, connection errors, 408, 429 and 5xx. Safe to send the same file again."""

    retryable = True

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        reason: str = "error",
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message, status=status, reason=reason)
        self.retry_after_s = retry_after_s


class FatalUploadError(UploadError):
    """Permanent until someone fixes configuration; `.setting` names the SINK_* variable to check."""

    retryable = False

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        reason: str = "error",
        setting: str | None = None,
    ) -> None:
        super().__init__(message, status=status, reason=reason)
        self.setting = setting


class RetriesExhaustedError(RetryableUploadError):
    """The retry budget ran out on a transient error; still retryable later from the caller's side."""

    def __init__(self, message: str, *, last_error: RetryableUploadError, attempts: int) -> None:
        super().__init__(
            message,
            status=last_error.status,
            reason=last_error.reason,
            retry_after_s=last_error.retry_after_s,
        )
        self.last_error = last_error
        self.attempts = attempts
