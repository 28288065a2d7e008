"""S3 (or S3-compatible) target: one object per Parquet file, at a key a replay overwrites.

Key: FileMetadata.object_key(prefix) = `<prefix>/<topic>/<partition>/<first:020d>-<last:020d>.parquet`,
so re-sending a range after a crash replaces the same object instead of adding a duplicate (the idea
worth keeping from Confluent's S3 sink). The object's user metadata carries the record count,
primary keys, order column, schema fingerprint and offsets, so a reader needs nothing else.

Files of at least `part_size` bytes go up as a multipart upload through boto3's transfer manager
(parts read from disk as they are sent, several at a time); a failed multipart upload is aborted by
the transfer manager, so no orphaned parts stay behind unless the process is killed mid-upload (an
`AbortIncompleteMultipartUpload` lifecycle rule on the bucket cleans those up).

Credentials come only from boto3's standard chain (environment, profile, web identity, instance or
pod role); nothing secret is held in S3Settings.

Retries, and why they are not counted twice: botocore retries each single HTTP request (one part of
a multipart upload, or the one PUT) up to `request_attempts` times in total, quickly, so a single
failed part does not restart a whole 64 MiB file. Everything that is still failing after that is
classified here and retried as a whole file by `call_with_retries` within the same RetryPolicy (time
budget) as EMS. `Receipt.attempts` counts whole-file attempts only; botocore's per-request retries
show up in the error message ("after N request attempts") when a whole-file attempt fails.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import pathlib
import string
import threading
import time
from collections.abc import Callable
from typing import Any, Self
from urllib.parse import quote

import boto3
import botocore.config
import botocore.exceptions
from boto3.exceptions import S3UploadFailedError
from boto3.s3.transfer import TransferConfig

from uploader.classify import (
    BODY_LIMIT,
    FatalHint,
    certificate_error,
    is_certificate_failure,
    is_retryable_status,
    parse_retry_after,
)
from uploader.errors import FatalUploadError, RetryableUploadError, UploadError
from uploader.masking import mask_userinfo
from uploader.retry import OnRetry, call_with_retries
from uploader.s3_settings import (
    BUCKET_SETTING,
    CREDENTIALS_SETTING,
    ENDPOINT_URL_SETTING,
    FILE_SIZE_SETTING,
    PART_SIZE_SETTING,
    PREFIX_SETTING,
    REGION_SETTING,
    S3Settings,
)
from uploader.target import FileMetadata, Receipt

log = logging.getLogger(__name__)

CONTENT_TYPE = "application/vnd.apache.parquet"

# Error codes that mean "not now" whatever their HTTP status (S3 sends RequestTimeout as a 400).
_RETRYABLE_CODES = frozenset({
    "SlowDown", "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottled",
    "RequestThrottledException", "TooManyRequestsException", "RequestLimitExceeded",
    "RequestTimeout", "RequestTimeoutException", "InternalError", "ServiceUnavailable", "503",
    "BadDigest", "IncompleteBody", "XAmzContentSHA256Mismatch", "OperationAborted", "NoSuchUpload",
    "PriorRequestNotComplete",
})
CLOCK_SETTING = "the system clock (NTP)"
_ACCESS_ADVICE = (
    "the credentials boto3 found may not write here; grant s3:PutObject and s3:AbortMultipartUpload "
    "on arn:aws:s3:::<bucket>/<prefix>/* to the user or role, or provide other credentials"
)
_HINTS_BY_CODE = {
    "NoSuchBucket": FatalHint(BUCKET_SETTING, "the bucket does not exist at this endpoint and region"),
    "InvalidBucketName": FatalHint(BUCKET_SETTING, "the bucket name is not valid"),
    "AllAccessDisabled": FatalHint(BUCKET_SETTING, "all access to this bucket has been disabled by its owner"),
    "AccessDenied": FatalHint(CREDENTIALS_SETTING, _ACCESS_ADVICE),
    "InvalidAccessKeyId": FatalHint(CREDENTIALS_SETTING, "the access key id is unknown to the store"),
    "SignatureDoesNotMatch": FatalHint(
        CREDENTIALS_SETTING,
        "the secret access key does not belong to the access key id (or something between us and the "
        "store changed the request)",
    ),
    "InvalidToken": FatalHint(CREDENTIALS_SETTING, "the session token is malformed or invalid"),
    "ExpiredToken": FatalHint(
        CREDENTIALS_SETTING,
        "the session token has expired; give boto3 credentials it can renew (a role, or a web-identity "
        "token file that is refreshed) instead of a fixed AWS_SESSION_TOKEN",
    ),
    "TokenRefreshRequired": FatalHint(CREDENTIALS_SETTING, "the session token must be refreshed"),
    "MissingSecurityHeader": FatalHint(CREDENTIALS_SETTING, "the request carries no credentials the store takes"),
    "InvalidSecurity": FatalHint(CREDENTIALS_SETTING, "the store does not accept these credentials"),
    "CredentialsNotSupported": FatalHint(CREDENTIALS_SETTING, "the store does not accept these credentials"),
    "RequestTimeTooSkewed": FatalHint(
        CLOCK_SETTING, "this machine's clock is more than 15 minutes away from the store's; sync it (NTP)"),
    "RequestExpired": FatalHint(
        CLOCK_SETTING, "the request's signature expired; this machine's clock is probably wrong"),
    "AccountProblem": FatalHint(CREDENTIALS_SETTING, "the account behind the credentials is not in good standing"),
    "PermanentRedirect": FatalHint(REGION_SETTING, "the bucket lives in another region"),
    "AuthorizationHeaderMalformed": FatalHint(REGION_SETTING, "the request was signed for the wrong region"),
    "InvalidRegion": FatalHint(REGION_SETTING, "the request was signed for a region the store does not serve"),
    "InvalidArgument": FatalHint(
        ENDPOINT_URL_SETTING,
        "the store refused an argument of the request (a header, checksum or signing style it does not "
        "take, or one its bucket policy requires); the server's message says which",
    ),
    "InvalidRequest": FatalHint(
        ENDPOINT_URL_SETTING, "the store refused the request as made; the server's message says why"),
    "KeyTooLongError": FatalHint(PREFIX_SETTING, "the object key is longer than the store accepts"),
    "EntityTooLarge": FatalHint(FILE_SIZE_SETTING, "the file is larger than the store accepts in one request"),
    "EntityTooSmall": FatalHint(PART_SIZE_SETTING, "a part is smaller than the store's minimum part size"),
    "NotImplemented": FatalHint(ENDPOINT_URL_SETTING, "the store does not implement this request"),
}
_HINTS_BY_STATUS = {
    301: _HINTS_BY_CODE["PermanentRedirect"],
    403: _HINTS_BY_CODE["AccessDenied"],
    404: _HINTS_BY_CODE["NoSuchBucket"],
    405: _HINTS_BY_CODE["NotImplemented"],
    413: _HINTS_BY_CODE["EntityTooLarge"],
}
_DEFAULT_HINT = FatalHint(BUCKET_SETTING, "the store refused the request; check the bucket, endpoint and region")
_CREDENTIAL_ERRORS = (
    botocore.exceptions.NoCredentialsError,
    botocore.exceptions.PartialCredentialsError,
    botocore.exceptions.CredentialRetrievalError,
)
# No HTTP answer, or a broken one: the network or the store is in trouble, not our request.
_TRANSIENT_ERRORS = (
    botocore.exceptions.ConnectionError,  # EndpointConnectionError, ConnectTimeoutError, ProxyConnectionError, SSLError
    botocore.exceptions.HTTPClientError,  # ReadTimeoutError, ConnectionClosedError, ResponseStreamingError
    botocore.exceptions.ChecksumError,
    botocore.exceptions.FlexibleChecksumError,
    botocore.exceptions.IncompleteReadError,
)
_PRINTABLE_ASCII = "".join(c for c in string.printable if c not in "%\t\n\r\x0b\x0c")


def s3_client(settings: S3Settings) -> Any:
    """A botocore S3 client configured from the settings; credentials from boto3's standard chain.

    Each call uses its own boto3 Session, because sessions are not safe to share between threads.
    """
    options: dict[str, Any] = {
        "connect_timeout": settings.request_timeout_s,
        "read_timeout": settings.request_timeout_s,
        "retries": {"mode": "standard", "total_max_attempts": settings.request_attempts},
        "user_agent_extra": "kafka-parquet-sink",
    }
    if settings.region:
        options["region_name"] = settings.region
    if settings.endpoint_url:
        # Most S3-compatible stores want path-style URLs (no bucket DNS names), and many reject the
        # CRC checksums botocore >= 1.36 adds by default; send checksums only where required.
        options["s3"] = {"addressing_style": "path"}
        options["request_checksum_calculation"] = "when_required"
        options["response_checksum_validation"] = "when_required"
    session = boto3.session.Session()
    return session.client(
        "s3", endpoint_url=settings.endpoint_url, verify=settings.ca_bundle, config=botocore.config.Config(**options)
    )


def object_metadata(metadata: FileMetadata) -> dict[str, str]:
    """User metadata (x-amz-meta-*) describing the file; non-ASCII text is percent-encoded UTF-8."""
    values = {
        "topic": metadata.topic,
        "partition": str(metadata.partition),
        "first-offset": str(metadata.first_offset),
        "last-offset": str(metadata.last_offset),
        "record-count": str(metadata.record_count),
        "schema-fingerprint": metadata.schema_fingerprint,
        "primary-keys": ",".join(metadata.primary_keys),
        "order-column": metadata.order_column or "",
    }
    return {name: quote(value, safe=_PRINTABLE_ASCII) for name, value in values.items() if value}


class S3Target:
    """UploadTarget for S3. Use one per task/thread, like EmsTarget."""

    name = "s3"

    def __init__(self, settings: S3Settings, client: Any = None) -> None:
        """A client passed in stays owned by the caller and is not closed by close()."""
        self.settings = settings
        self._owns_client = client is None
        self._client = client if client is not None else s3_client(settings)
        self._transfer = TransferConfig(
            multipart_threshold=settings.part_size,
            multipart_chunksize=settings.part_size,
            preferred_transfer_client="classic",  # the same code path whether or not awscrt is installed
        )
        # ETag and VersionId come back on PutObject / CompleteMultipartUpload, which upload_file does
        # not return; catch them on the way past instead of paying a HEAD request (and a permission).
        self._answers: dict[tuple[str, str], dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._hooks = [
            (f"{event}.s3.{operation}", handler)
            for operation in ("PutObject", "CompleteMultipartUpload")
            for event, handler in (
                ("before-parameter-build", self._remember_object),
                ("after-call", self._remember_answer),
            )
        ]
        for event, handler in self._hooks:
            self._client.meta.events.register(event, handler)

    @property
    def client(self) -> Any:
        return self._client

    def upload(self, path: pathlib.Path, metadata: FileMetadata, on_retry: OnRetry | None = None) -> Receipt:
        """Write the file to its deterministic key, retrying transient failures within the budget."""
        path = pathlib.Path(path)
        size = path.stat().st_size
        bucket, key = self.settings.bucket, self.settings.object_key(metadata)
        uri = self.settings.uri(key)
        what = f"S3 upload of {metadata.file_name()} ({size} bytes) to {uri}"
        extra = {"Metadata": object_metadata(metadata), "ContentType": CONTENT_TYPE}
        started = time.monotonic()
        answer, attempts = call_with_retries(
            lambda attempt: self._put(path, bucket, key, extra, what, attempt), self.settings.retry, on_retry
        )
        etag = (answer.get("ETag") or "").strip('"') or None
        version_id = answer.get("VersionId")
        if version_id == "null":  # S3's name for "no version" (unversioned or suspended bucket)
            version_id = None
        return Receipt(
            target=self.name,
            location=uri,
            response_id=version_id or etag,
            bytes=size,
            attempts=attempts,
            duration_s=time.monotonic() - started,
            details={
                "bucket": bucket,
                "key": key,
                "etag": etag,
                "version_id": version_id,
                "multipart": size >= self.settings.part_size,
            },
        )

    def put_object(self, key: str, body: bytes, content_type: str) -> str:
        """Write a small object in one request (S3 makes it visible whole or not at all); its URI."""
        what = f"S3 write of {self.settings.uri(key)}"
        try:
            self._client.put_object(Bucket=self.settings.bucket, Key=key, Body=body, ContentType=content_type)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            raise classify_error(exc, what=what) from exc
        return self.settings.uri(key)

    def download(self, key: str, destination: pathlib.Path) -> bool:
        """Copy an object to a local file; False when there is no such object."""
        return self._unless_missing(lambda: self._client.download_file(self.settings.bucket, key, str(destination))
                                    or True, f"S3 download of {self.settings.uri(key)}") is not None

    def read(self, key: str) -> bytes | None:
        """An object's bytes; None when there is no such object."""
        def body() -> bytes:
            return self._client.get_object(Bucket=self.settings.bucket, Key=key)["Body"].read()

        return self._unless_missing(body, f"S3 read of {self.settings.uri(key)}")

    @staticmethod
    def _unless_missing(call: Callable[[], Any], what: str) -> Any:
        try:
            return call()
        except botocore.exceptions.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey"):
                return None
            raise classify_error(exc, what=what) from exc
        except botocore.exceptions.BotoCoreError as exc:
            raise classify_error(exc, what=what) from exc

    def describe_request(self, path: pathlib.Path, metadata: FileMetadata) -> dict[str, Any]:
        """What upload() would send; for a --dry-run that touches no network."""
        path = pathlib.Path(path)
        size = path.stat().st_size
        key = self.settings.object_key(metadata)
        multipart = size >= self.settings.part_size
        return {
            "method": "multipart upload" if multipart else "PUT",
            "endpoint_url": mask_userinfo(self._client.meta.endpoint_url),
            "region": self._client.meta.region_name,
            "bucket": self.settings.bucket,
            "key": key,
            "uri": self.settings.uri(key),
            "metadata": object_metadata(metadata),
            "content_type": CONTENT_TYPE,
            "file_path": str(path),
            "file_size": size,
            "part_size": self.settings.part_size,
            "parts": max(1, math.ceil(size / self.settings.part_size)) if multipart else 1,
            "credentials": "boto3 default chain (environment, profile, web identity, instance/pod role)",
            "ca_bundle": self.settings.ca_bundle,
            "timeout_s": self.settings.request_timeout_s,
            "retry": dataclasses.asdict(self.settings.retry),
        }

    def close(self) -> None:
        for event, handler in self._hooks:
            self._client.meta.events.unregister(event, handler)
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- internals ------------------------------------------------------------------------------

    def _put(
        self, path: pathlib.Path, bucket: str, key: str, extra: dict[str, Any], what: str, attempt: int
    ) -> dict[str, Any]:
        log.debug("%s: attempt %d", what, attempt)
        with self._lock:
            self._answers.pop((bucket, key), None)
        try:
            self._client.upload_file(str(path), bucket, key, ExtraArgs=extra, Config=self._transfer)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError, S3UploadFailedError) as exc:
            raise classify_error(exc, what=what) from exc
        with self._lock:
            return self._answers.pop((bucket, key), {})

    def _remember_object(self, params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        context["uploader_object"] = (params.get("Bucket"), params.get("Key"))

    def _remember_answer(self, http_response: Any, parsed: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        target = context.get("uploader_object")
        if target is not None and 200 <= http_response.status_code < 300:
            with self._lock:
                self._answers[target] = {"ETag": parsed.get("ETag"), "VersionId": parsed.get("VersionId")}


def classify_error(exc: BaseException, *, what: str) -> UploadError:
    """Retryable when the store or the network is in trouble; fatal, naming what to fix, otherwise."""
    if isinstance(exc, S3UploadFailedError):
        # boto3 wraps a part's ClientError in this; the original is the implicit context.
        inner = exc.__cause__ or exc.__context__
        if isinstance(inner, botocore.exceptions.ClientError | botocore.exceptions.BotoCoreError):
            exc = inner
    if isinstance(exc, botocore.exceptions.ClientError):
        return _error_for_client_error(exc, what)
    detail = _short(f"{type(exc).__name__}: {exc}")
    if is_certificate_failure(exc):  # SSLError, or ProxyConnectionError through an https proxy
        return certificate_error(what, detail, ENDPOINT_URL_SETTING)
    if isinstance(exc, _TRANSIENT_ERRORS):
        reason = "timeout" if "timeout" in type(exc).__name__.lower() else "connection"
        return RetryableUploadError(f"{what} failed: {detail}", reason=reason)
    if isinstance(exc, _CREDENTIAL_ERRORS):
        return FatalUploadError(
            f"{what}: boto3 found no usable credentials; this will not be retried. Check "
            f"{CREDENTIALS_SETTING}. ({detail})",
            reason="no_credentials",
            setting=CREDENTIALS_SETTING,
        )
    if isinstance(exc, botocore.exceptions.NoRegionError | botocore.exceptions.InvalidRegionError):
        return FatalUploadError(
            f"{what}: {detail}; this will not be retried. Check {REGION_SETTING}.",
            reason="region",
            setting=REGION_SETTING,
        )
    if isinstance(exc, botocore.exceptions.ParamValidationError):
        return FatalUploadError(
            f"{what}: the request is not valid ({detail}); this will not be retried. Check "
            f"{BUCKET_SETTING} and {PREFIX_SETTING}.",
            reason="invalid_request",
            setting=BUCKET_SETTING,
        )
    # Anything else from botocore is a local problem (configuration, an unsupported feature).
    return FatalUploadError(
        f"{what}: {detail}; this will not be retried. Check {ENDPOINT_URL_SETTING} and {REGION_SETTING}.",
        reason="client",
        setting=ENDPOINT_URL_SETTING,
    )


def _error_for_client_error(exc: botocore.exceptions.ClientError, what: str) -> UploadError:
    response = exc.response or {}
    error = response.get("Error", {})
    meta = response.get("ResponseMetadata", {})
    code = str(error.get("Code") or "")
    status = meta.get("HTTPStatusCode")
    message = _short(str(error.get("Message") or exc))
    label = " ".join(bit for bit in (code, f"(HTTP {status})" if status else "") if bit) or "an error"
    extras = []
    if meta.get("RequestId"):
        extras.append(f"request id {meta['RequestId']}")
    if meta.get("RetryAttempts"):
        extras.append(f"after {meta['RetryAttempts'] + 1} request attempts")
    said = f"{message} ({', '.join(extras)})" if extras else message
    retryable = code in _RETRYABLE_CODES or (
        code not in _HINTS_BY_CODE and status is not None and is_retryable_status(status)
    )
    if retryable:
        headers = meta.get("HTTPHeaders", {})
        return RetryableUploadError(
            f"{what} failed with {label}: {said}",
            status=status,
            reason=f"s3_{code}" if code else f"http_{status}",
            retry_after_s=parse_retry_after(headers.get("retry-after")),
        )
    hint = _HINTS_BY_CODE.get(code) or _HINTS_BY_STATUS.get(status or 0, _DEFAULT_HINT)
    return FatalUploadError(
        f"{what} was rejected with {label} and will not be retried: {hint.advice}. "
        f"Check {hint.setting}. Server said: {said}",
        status=status,
        reason=f"s3_{code}" if code else f"http_{status}",
        setting=hint.setting,
    )


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= BODY_LIMIT else text[: BODY_LIMIT - 1] + "…"
