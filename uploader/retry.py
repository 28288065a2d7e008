"""Bounded retries for transient upload failures.

The budget is wall-clock time, not attempts, because the caller holds a Kafka range open while we
retry: it must get control back in predictable time, then replay the range later.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from tenacity import RetryCallState, Retrying, retry_if_exception_type

from uploader.errors import RetriesExhaustedError, RetryableUploadError

# on_retry(error, failed_attempt, wait_s): called before each wait, e.g. to count retries by reason.
OnRetry = Callable[[RetryableUploadError, int, float], None]

T = TypeVar("T")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetryPolicy:
    """How long one upload may keep trying; frozen and hashable so it can ship to Spark executors."""

    max_elapsed_s: float = 60.0  # total budget for one upload including waits
    initial_backoff_s: float = 0.5
    max_backoff_s: float = 30.0
    max_attempts: int | None = None  # None = bounded only by time

    def __post_init__(self) -> None:
        if self.max_elapsed_s < 0 or self.initial_backoff_s < 0 or self.max_backoff_s < 0:
            raise ValueError(f"retry policy durations must be >= 0: {self}")
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ValueError(f"retry policy max_attempts must be >= 1 or None: {self}")


def backoff_wait(
    policy: RetryPolicy,
    attempt: int,
    retry_after_s: float | None,
    remaining_s: float,
    rng: random.Random | None = None,
) -> float:
    """Full jitter spreads many executors' retries apart; the server's Retry-After is a floor.

    `attempt` is the number of the attempt that just failed (1-based). The result never exceeds
    `remaining_s`, so a wait cannot carry the upload past its budget.
    """
    exponent = min(max(attempt - 1, 0), 62)  # 2**62 is far beyond any max_backoff_s; avoids overflow
    ceiling = min(policy.max_backoff_s, policy.initial_backoff_s * 2.0**exponent)
    wait = (rng or random).uniform(0.0, ceiling)
    if retry_after_s is not None:
        wait = max(wait, retry_after_s)
    return max(0.0, min(wait, remaining_s))


def call_with_retries(
    fn: Callable[[int], T],
    policy: RetryPolicy,
    on_retry: OnRetry | None = None,
) -> tuple[T, int]:
    """fn(attempt_number) -> result; returns (result, attempts).

    Retries RetryableUploadError only, with exponential backoff + full jitter, honouring
    retry_after_s (waits max(backoff, retry_after) but never past the budget; if the server asks for
    more time than is left we stop rather than call back early). FatalUploadError and any other
    exception propagate at once. When the budget runs out, RetriesExhaustedError names the last error.
    `on_retry(error, failed_attempt, wait_s)` runs before each wait, e.g. for metrics.
    """
    started = time.monotonic()

    def remaining() -> float:
        return policy.max_elapsed_s - (time.monotonic() - started)

    def last_error(state: RetryCallState) -> RetryableUploadError:
        assert state.outcome is not None
        error = state.outcome.exception()
        assert isinstance(error, RetryableUploadError)
        return error

    def wait(state: RetryCallState) -> float:
        error = last_error(state)
        return backoff_wait(policy, state.attempt_number, error.retry_after_s, remaining())

    def stop(state: RetryCallState) -> bool:
        if policy.max_attempts is not None and state.attempt_number >= policy.max_attempts:
            return True
        left = remaining()
        retry_after = last_error(state).retry_after_s
        return left <= 0 or (retry_after is not None and retry_after > left)

    def before_sleep(state: RetryCallState) -> None:
        error, wait_s = last_error(state), state.upcoming_sleep
        log.warning(
            "upload attempt %d failed (%s), retrying in %.2fs (%.1fs of %.1fs budget left): %s",
            state.attempt_number,
            error.reason,
            wait_s,
            max(remaining(), 0.0),
            policy.max_elapsed_s,
            error,
        )
        if on_retry is not None:
            on_retry(error, state.attempt_number, wait_s)

    def give_up(state: RetryCallState) -> None:
        error, attempts = last_error(state), state.attempt_number
        elapsed = time.monotonic() - started
        why = f"retry budget of {policy.max_elapsed_s:g}s"
        if policy.max_attempts is not None and attempts >= policy.max_attempts:
            why = f"limit of {policy.max_attempts} attempts"
        elif error.retry_after_s is not None and error.retry_after_s > remaining() > 0:
            why = f"server asked to wait {error.retry_after_s:g}s, beyond the retry budget"
        raise RetriesExhaustedError(
            f"gave up after {attempts} attempt(s) in {elapsed:.1f}s ({why}); last error: {error}",
            last_error=error,
            attempts=attempts,
        ) from error

    retrying = Retrying(
        retry=retry_if_exception_type(RetryableUploadError),
        wait=wait,
        stop=stop,
        before_sleep=before_sleep,
        retry_error_callback=give_up,
    )
    for attempt in retrying:
        with attempt:
            attempts = attempt.retry_state.attempt_number
            result = fn(attempts)
    # tenacity ends the loop only after a successful attempt (failures raise out of it).
    return result, attempts
