"""How delta-rs reaches a table: the storage options for a directory or an s3:// table.

delta-rs does not read boto3's credential chain, so the credentials are resolved with botocore (keys,
profile, role, web identity, container, instance metadata) and passed explicitly. The target that merges
files and `sink-service verify` that reads the table back open it the same way.

Credentials (one cache per process, `CredentialCache`):
- Temporary credentials (a role, web identity, the container's or the instance's) are reused until
  REFRESH_BEFORE_EXPIRY_S before they expire, so the storage options stay identical from merge to merge
  and the DeltaTarget keeps its opened table (it reopens when the options change): a new set of keys per
  merge (what resolving the chain each time gave with web identity) reloaded the whole table each time.
  Keys without an expiry (environment, credentials file) are read again at each call (~7 ms): a rotated
  file is picked up at once, and unchanged keys change nothing. A change of the chain's environment
  variables resolves again.
- Obtaining them can fail for a moment: the instance metadata service answers slowly (botocore then
  finds no credentials at all; it is asked up to IMDS_ATTEMPTS times), STS or the container endpoint
  times out or answers 5xx/throttling. That is a RetryableUploadError (reason `credentials`), retried
  within the upload's budget. While the held credentials are still valid for MIN_REMAINING_S, any
  failure to refresh them is a WARNING and they are used meanwhile (asked again after
  RETRY_REFRESH_AFTER_S). A refusal (AccessDenied, an invalid web-identity token, a missing profile)
  and no credentials in a chain that never gave any are fatal, naming what to check.

TLS. delta-rs (object_store over reqwest and rustls) reads none of boto3's or requests' CA settings.
SINK_TLS_CA_BUNDLE reaches it as the storage option `certificate_path` (delta-rs >= 1.5.1; measured with
1.6.6 in tests/component/uploader/test_delta_tls.py): every certificate in the PEM file is trusted, in
addition to the default roots (the system's, or SSL_CERT_FILE/SSL_CERT_DIR when set) - delta-rs offers no
way to drop those, so unlike the other clients the bundle does not replace them here. An explicit
`certificate_path` also wins over delta-rs's own fallback to SSL_CERT_FILE for that option. No
environment variable is set: SSL_CERT_FILE would reach every TLS client of the process (librdkafka's
default CA store in the executor when SINK_KAFKA_SSL_CA_LOCATION is empty, Python's ssl defaults).
`aws_ca_bundle`, `ca_bundle` and AWS_CA_BUNDLE are ignored by delta-rs (measured).
"""

from __future__ import annotations

import datetime
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from uploader.delta_settings import S3_SCHEME, DeltaSettings
from uploader.errors import FatalUploadError, RetryableUploadError, UploadError
from uploader.s3_settings import CREDENTIALS_SETTING, S3Settings

log = logging.getLogger(__name__)

CERTIFICATE_PATH_OPTION = "certificate_path"
# How delta-rs words a certificate that does not verify (rustls: UnknownIssuer, NotValidForName, expired,
# ...), and a bundle it cannot load; object_store has retried the request by then (10 times, seconds).
_CERTIFICATE_FAILURE_WORDS = ("invalid peer certificate", "CERTIFICATE_VERIFY_FAILED")
_BUNDLE_FAILURE_WORDS = ("Failed to open certificate file", "Failed to read certificate file",
                         "Failed to parse PEM certificate")

REFRESH_BEFORE_EXPIRY_S = 15 * 60  # botocore's own advisory refresh window
MIN_REMAINING_S = 5 * 60  # held credentials still used while a refresh fails: a merge must finish with them
RETRY_REFRESH_AFTER_S = 30.0  # after a failed refresh with usable credentials held, the next attempt
IMDS_ATTEMPTS = 3  # botocore asks the instance metadata service once (1 s timeout) by default
CREDENTIALS_REASON = "credentials"
# What botocore's credential chain reads from the environment: a change resolves the chain again.
_CHAIN_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                    "AWS_DEFAULT_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_ROLE_ARN",
                    "AWS_ROLE_SESSION_NAME", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                    "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_AUTHORIZATION_TOKEN",
                    "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", "AWS_EC2_METADATA_DISABLED",
                    "AWS_EC2_METADATA_SERVICE_ENDPOINT", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_STS",
                    "AWS_REGION", "AWS_DEFAULT_REGION")
# STS / container answers that say "later" rather than "no".
_TRANSIENT_CODES = frozenset({"Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequestsException",
                              "IDPCommunicationError", "ServiceUnavailable", "InternalError", "InternalFailure",
                              "RequestTimeout", "RequestTimeoutException", "SlowDown"})


@dataclass(frozen=True)
class ResolvedCredentials:
    """One set of keys from the chain; `expires_at` (Unix time) None for keys that do not expire."""

    access_key: str
    secret_key: str
    token: str | None
    expires_at: float | None
    region: str | None
    method: str = ""  # botocore's name of the source: env, shared-credentials-file, assume-role-with-web-identity, ...


def resolve_with_botocore() -> ResolvedCredentials | None:
    """botocore's default chain, once; None when it finds nothing (the instance metadata service not
    answering looks the same as no source at all)."""
    import botocore.session  # only for tables on S3

    session = botocore.session.get_session()
    attempts = session.get_config_variable("metadata_service_num_attempts")
    if int(attempts or 1) < IMDS_ATTEMPTS:
        session.set_config_variable("metadata_service_num_attempts", IMDS_ATTEMPTS)
    credentials = session.get_credentials()
    if credentials is None:
        return None
    frozen = credentials.get_frozen_credentials()  # a deferred source (role, web identity) fetches here
    expiry = getattr(credentials, "_expiry_time", None)  # RefreshableCredentials; plain keys have none
    return ResolvedCredentials(
        frozen.access_key, frozen.secret_key, frozen.token or None,
        expiry.timestamp() if isinstance(expiry, datetime.datetime) else None,
        session.get_config_variable("region"), getattr(credentials, "method", "") or "")


def _chain_environment() -> tuple[str | None, ...]:
    return tuple(os.environ.get(name) for name in _CHAIN_VARIABLES)


class CredentialCache:
    """The chain's credentials, reused until they near expiry (module doc); thread-safe."""

    def __init__(self, resolve: Callable[[], ResolvedCredentials | None] = resolve_with_botocore,
                 clock: Callable[[], float] = time.time,
                 environment: Callable[[], tuple[str | None, ...]] = _chain_environment) -> None:
        self._resolve, self._clock, self._environment = resolve, clock, environment
        self._lock = threading.Lock()
        self._held: ResolvedCredentials | None = None
        self._held_for: tuple[str | None, ...] | None = None  # the environment they were resolved in
        self._obtained = False  # the chain (in this environment) gave credentials before
        self._retry_at = 0.0

    def get(self, what: str) -> ResolvedCredentials:
        """Credentials for `what` (a table, for messages); UploadError when there are none to use."""
        with self._lock:
            now, environment = self._clock(), self._environment()
            if environment != self._held_for:
                self._held, self._held_for, self._obtained, self._retry_at = None, environment, False, 0.0
            held = self._held
            if held is not None and (self._fresh(held, now) or (now < self._retry_at and self._usable(held, now))):
                return held
            try:
                resolved = self._resolve()
                error: UploadError | None = None if resolved is not None else self._none_found(what)
            except Exception as exc:  # botocore's errors, or OSError/ValueError from a source
                resolved, error = None, credential_error(exc, what)
            if error is None and resolved is not None:
                self._held, self._obtained, self._retry_at = resolved, True, 0.0
                return resolved
            assert error is not None
            if held is not None and self._usable(held, now):  # as botocore does in its advisory window
                self._retry_at = now + RETRY_REFRESH_AFTER_S
                log.warning("%s. Meanwhile the credentials held stay in use (until %s)", error, _until(held))
                return held
            raise error

    def clear(self) -> None:
        with self._lock:
            self._held, self._held_for, self._obtained, self._retry_at = None, None, False, 0.0

    @staticmethod
    def _fresh(held: ResolvedCredentials, now: float) -> bool:
        """Reused without asking the chain: temporary credentials not yet within the refresh window. Keys
        without an expiry are read again (cheap, and a rotated credentials file counts at once)."""
        return held.expires_at is not None and now < held.expires_at - REFRESH_BEFORE_EXPIRY_S

    @staticmethod
    def _usable(held: ResolvedCredentials, now: float) -> bool:
        return held.expires_at is None or now < held.expires_at - MIN_REMAINING_S

    def _none_found(self, what: str) -> UploadError:
        if self._obtained:  # the source that answered before did not (the instance metadata service, slow)
            return RetryableUploadError(
                f"{what}: AWS credentials could not be obtained this time (the source that gave them before, "
                "e.g. the instance metadata service, did not answer); retrying", reason=CREDENTIALS_REASON)
        return FatalUploadError(
            f"{what}: boto3 found no credentials; this will not be retried. Check {CREDENTIALS_SETTING} (on EC2: "
            f"the instance role, and that the instance metadata service answers).",
            reason="no_credentials", setting=CREDENTIALS_SETTING)


def credential_error(exc: BaseException, what: str) -> UploadError:
    """A failure to obtain credentials: retryable when the source may answer later (a timeout, a connection
    error, 5xx or throttling from STS or the container endpoint), fatal when it said no."""
    from botocore.exceptions import (
        ClientError,
        ConnectionError,
        CredentialRetrievalError,
        HTTPClientError,
        MetadataRetrievalError,
    )

    detail = " ".join(f"{type(exc).__name__}: {exc}".split())[:400]
    transient = isinstance(exc, ConnectionError | HTTPClientError | CredentialRetrievalError | MetadataRetrievalError
                           | TimeoutError | ConnectionRefusedError | ConnectionResetError)
    status = None
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        transient = error.get("Code") in _TRANSIENT_CODES or (status is not None and (status >= 500 or status == 429))
    if transient:
        return RetryableUploadError(f"{what}: AWS credentials could not be obtained for now ({detail}); retrying",
                                    status=status, reason=CREDENTIALS_REASON)
    return FatalUploadError(
        f"{what}: AWS credentials could not be obtained ({detail}); this will not be retried. Check "
        f"{CREDENTIALS_SETTING}.", status=status, reason="credentials_refused", setting=CREDENTIALS_SETTING)


def _until(held: ResolvedCredentials) -> str:
    if held.expires_at is None:
        return "the chain answers again"
    last = held.expires_at - MIN_REMAINING_S
    return datetime.datetime.fromtimestamp(last, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


CREDENTIALS = CredentialCache()


def storage_options(settings: DeltaSettings) -> dict[str, str]:
    """Options for `DeltaTable(uri, storage_options=…)`; empty for a directory.

    The same dict from call to call while the process's credentials are reused (module doc); a
    RetryableUploadError (reason `credentials`) when they cannot be obtained for now, FatalUploadError
    when the chain refuses or has none."""
    if not settings.on_s3():
        return {}
    credentials = CREDENTIALS.get(f"Delta table {settings.table_uri}")
    options = {
        "AWS_ACCESS_KEY_ID": credentials.access_key,
        "AWS_SECRET_ACCESS_KEY": credentials.secret_key,
        "AWS_REGION": settings.region or credentials.region or "us-east-1",
        "timeout": f"{max(1, round(settings.request_timeout_s))}s",
    }
    if credentials.token:
        options["AWS_SESSION_TOKEN"] = credentials.token
    if settings.endpoint_url:
        options["AWS_ENDPOINT_URL"] = settings.endpoint_url
        if settings.endpoint_url.startswith("http://"):
            options["AWS_ALLOW_HTTP"] = "true"
    if settings.ca_bundle:
        options[CERTIFICATE_PATH_OPTION] = settings.ca_bundle
    return options


def s3_settings_at(settings: DeltaSettings, uri: str) -> S3Settings:
    """Settings for reaching `s3://bucket/prefix` beside the table through boto3 (staged files, the log's
    entries), with the table's endpoint, region, CA bundle and timeouts."""
    bucket, _, prefix = uri.removeprefix(S3_SCHEME).partition("/")
    return S3Settings(bucket=bucket, prefix=prefix, endpoint_url=settings.endpoint_url, region=settings.region,
                      ca_bundle=settings.ca_bundle, request_timeout_s=settings.request_timeout_s, retry=settings.retry)


def certificate_failure(exc: BaseException) -> bool:
    """The endpoint's certificate did not verify, or the CA bundle could not be loaded: retrying cannot
    help, a CA (SINK_TLS_CA_BUNDLE) or the endpoint URL must change."""
    text = str(exc)
    return any(word in text for word in (*_CERTIFICATE_FAILURE_WORDS, *_BUNDLE_FAILURE_WORDS))


_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # delta-rs colours the arrows of its error chains


def error_text(exc: BaseException) -> str:
    """A delta-rs error as one plain line: without terminal colour codes, whitespace collapsed."""
    return " ".join(_ANSI.sub("", str(exc)).split())
