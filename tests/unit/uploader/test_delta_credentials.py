"""The Delta target's credentials (uploader.delta_storage.CredentialCache), with a fake chain and clock:
temporary keys are reused until they near expiry, a failure to obtain them is retried (or bridged by keys
still valid), and only a refusal or a chain that never gave any is fatal (issue #37 item 10)."""

from __future__ import annotations

import logging

import pytest
from botocore.exceptions import (
    ClientError,
    ConnectTimeoutError,
    CredentialRetrievalError,
    ProfileNotFound,
)

import uploader.delta_storage as delta_storage
from uploader.delta_settings import DeltaSettings
from uploader.delta_storage import (
    MIN_REMAINING_S,
    REFRESH_BEFORE_EXPIRY_S,
    RETRY_REFRESH_AFTER_S,
    CredentialCache,
    ResolvedCredentials,
    credential_error,
    storage_options,
)
from uploader.errors import FatalUploadError, RetryableUploadError
from uploader.retry import RetryPolicy, call_with_retries

HOUR = 3600.0


class FakeChain:
    """A credential source: each call answers the next scripted item (keys expiring `ttl` after the call,
    None for "found nothing", or an exception), then keeps answering fresh keys."""

    def __init__(self, clock: list[float], ttl: float | None = HOUR, script: list[object] | None = None) -> None:
        self.clock, self.ttl, self.script, self.calls = clock, ttl, list(script or []), 0

    def __call__(self) -> ResolvedCredentials | None:
        self.calls += 1
        item = self.script.pop(0) if self.script else "keys"
        if isinstance(item, BaseException):
            raise item
        if item is None:
            return None
        expires = None if self.ttl is None else self.clock[0] + self.ttl
        return ResolvedCredentials(f"AKIA{self.calls}", f"secret{self.calls}", f"token{self.calls}", expires,
                                   "eu-west-1", "fake")


def cache_for(chain: FakeChain, clock: list[float], environment: list[tuple] | None = None) -> CredentialCache:
    env = environment if environment is not None else [("a",)]
    return CredentialCache(chain, clock=lambda: clock[0], environment=lambda: env[0])


def test_temporary_keys_are_reused_until_the_refresh_window_then_refreshed_once():
    clock = [1_000_000.0]
    chain = FakeChain(clock)
    cache = cache_for(chain, clock)
    first = cache.get("t")
    for step in range(0, int(HOUR - REFRESH_BEFORE_EXPIRY_S), 60):  # a merge a minute for 45 minutes
        clock[0] = 1_000_000.0 + step
        assert cache.get("t") is first
    assert chain.calls == 1
    clock[0] = first.expires_at - REFRESH_BEFORE_EXPIRY_S + 1  # within 15 minutes of expiry
    second = cache.get("t")
    assert second.access_key == "AKIA2" and chain.calls == 2
    assert cache.get("t") is second and chain.calls == 2


def test_the_storage_options_stay_identical_between_merges(monkeypatch):
    clock = [1_000_000.0]
    chain = FakeChain(clock)
    monkeypatch.setattr(delta_storage, "CREDENTIALS", cache_for(chain, clock))
    settings = DeltaSettings(table_uri="s3://bucket/lake/orders", group_id="g", endpoint_url="http://127.0.0.1:9")
    options = storage_options(settings)
    clock[0] += 30 * 60
    assert storage_options(settings) == options and chain.calls == 1
    assert options["AWS_SESSION_TOKEN"] == "token1" and options["AWS_REGION"] == "eu-west-1"


def test_keys_without_expiry_are_read_again_each_time_and_a_change_of_the_environment_resolves_again():
    clock = [0.0]
    chain = FakeChain(clock, ttl=None)
    env = [("first",)]
    cache = cache_for(chain, clock, env)
    cache.get("t")
    cache.get("t")
    assert chain.calls == 2  # a rotated credentials file counts at once
    timed = FakeChain(clock)
    cache = cache_for(timed, clock, env)
    cache.get("t")
    env[0] = ("second",)
    assert cache.get("t").access_key == "AKIA2" and timed.calls == 2


def test_a_transient_failure_with_nothing_held_is_retried_within_the_upload_budget():
    clock = [0.0]
    timeout = ConnectTimeoutError(endpoint_url="http://169.254.170.2/creds")
    chain = FakeChain(clock, script=[timeout, CredentialRetrievalError(provider="container-role", error_msg="500")])
    cache = cache_for(chain, clock)
    with pytest.raises(RetryableUploadError) as raised:
        cache.get("Delta table s3://b/t")
    assert raised.value.reason == "credentials" and "could not be obtained for now" in str(raised.value)
    retried: list[str] = []
    got, attempts = call_with_retries(lambda attempt: cache.get("t"), RetryPolicy(
        max_elapsed_s=5, initial_backoff_s=0.001, max_backoff_s=0.01), lambda e, n, w: retried.append(e.reason))
    assert attempts == 2 and retried == ["credentials"] and got.access_key == "AKIA3"


def test_a_failed_refresh_keeps_the_held_keys_while_they_last_then_is_retryable(caplog):
    clock = [0.0]
    chain = FakeChain(clock)
    cache = cache_for(chain, clock)
    held = cache.get("t")
    chain.script = [ConnectTimeoutError(endpoint_url="http://169.254.169.254")] * 2
    clock[0] = held.expires_at - REFRESH_BEFORE_EXPIRY_S + 10
    with caplog.at_level(logging.WARNING, logger="uploader.delta_storage"):
        assert cache.get("t") is held
    assert "credentials held stay in use (until 1970-01-01T00:55:00Z)" in caplog.text and chain.calls == 2
    clock[0] += RETRY_REFRESH_AFTER_S - 1
    assert cache.get("t") is held and chain.calls == 2  # not asked again at once
    clock[0] = held.expires_at - MIN_REMAINING_S + 1  # too close to expiry for a merge to finish with them
    with pytest.raises(RetryableUploadError):
        cache.get("t")
    assert chain.calls == 3
    assert cache.get("t").access_key == "AKIA4"  # the source answers again


def test_nothing_found_is_fatal_for_a_chain_that_never_gave_any_and_retryable_for_one_that_did():
    clock = [0.0]
    cache = cache_for(FakeChain(clock, script=[None]), clock)
    with pytest.raises(FatalUploadError) as fatal:
        cache.get("Delta table s3://b/t")
    assert fatal.value.reason == "no_credentials" and "instance metadata service" in str(fatal.value)

    chain = FakeChain(clock, script=["keys", None])
    cache = cache_for(chain, clock)
    held = cache.get("t")
    clock[0] = held.expires_at - MIN_REMAINING_S + 1  # the instance metadata service did not answer in time
    with pytest.raises(RetryableUploadError) as retryable:
        cache.get("Delta table s3://b/t")
    assert "did not answer" in str(retryable.value)


def _client_error(code: str, status: int) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}},
                       "AssumeRoleWithWebIdentity")


@pytest.mark.parametrize(("error", "retryable"), [
    (_client_error("ServiceUnavailable", 503), True),
    (_client_error("IDPCommunicationError", 400), True),
    (_client_error("Throttling", 400), True),
    (ConnectTimeoutError(endpoint_url="https://sts.amazonaws.com"), True),
    (CredentialRetrievalError(provider="container-role", error_msg="timed out"), True),
    (_client_error("AccessDenied", 403), False),
    (_client_error("InvalidIdentityToken", 400), False),
    (ProfileNotFound(profile="prod"), False),
])
def test_failures_to_obtain_credentials_are_classified(error: Exception, retryable: bool):
    classified = credential_error(error, "Delta table s3://b/t")
    assert classified.retryable is retryable
    if not retryable:
        assert isinstance(classified, FatalUploadError) and classified.setting.startswith("AWS credentials")
