"""Turn an HTTP outcome into the right UploadError: retry it, or tell a person what to fix.

Kept apart from any one target so the rules (which statuses retry, how Retry-After is read) are
the same for every HTTP endpoint and can be tested without a network.
"""

from __future__ import annotations

import email.utils
import http
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

import requests

from uploader.errors import FatalUploadError, RetryableUploadError, UploadError
from uploader.masking import redact

BODY_LIMIT = 500
CA_BUNDLE_SETTING = "SINK_TLS_CA_BUNDLE"
_DELAY_SECONDS = re.compile(r"\s*(\d+(?:\.\d+)?)\s*")
# Order matters: ConnectTimeout is also a ConnectionError, ProxyError and SSLError are too. An
# SSLError from a certificate that does not verify is caught before these (see certificate_error).
_TRANSIENT: tuple[tuple[type[requests.RequestException], str], ...] = (
    (requests.exceptions.Timeout, "timeout"),
    (requests.exceptions.ProxyError, "proxy"),
    (requests.exceptions.SSLError, "tls"),
    (requests.exceptions.ConnectionError, "connection"),
    (requests.exceptions.ChunkedEncodingError, "connection"),
    (requests.exceptions.ContentDecodingError, "connection"),
)


@dataclass(frozen=True)
class FatalHint:
    """What a person should change when the endpoint rejects a request with a given status."""

    setting: str  # the SINK_* variable to check
    advice: str


def is_retryable_status(status: int) -> bool:
    """408/429 and 5xx say "not now"; every other 4xx says "not like this"."""
    return status in (408, 429) or 500 <= status <= 599


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """Seconds to wait per a Retry-After header (delay-seconds or HTTP-date); None if absent/invalid."""
    if value is None:
        return None
    match = _DELAY_SECONDS.fullmatch(value)
    if match:
        return float(match.group(1))
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # "-0000" means UTC with unknown origin
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def body_excerpt(text: str, limit: int = BODY_LIMIT) -> str:
    """Short, single-line version of an error body; JSON {message, reference} is spelled out."""
    text = text.strip()
    try:
        parsed = json.loads(text) if text[:1] in "{[" and text else None
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and ("message" in parsed or "reference" in parsed):
        bits = [str(parsed.get("message", "")).strip()]
        if parsed.get("reference") is not None:
            bits.append(f"(reference {parsed['reference']})")
        text = " ".join(b for b in bits if b)
    elif parsed is not None:
        text = json.dumps(parsed, separators=(",", ":"), ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def error_for_status(
    status: int,
    *,
    what: str,
    body: str,
    retry_after_s: float | None,
    hints: Mapping[int, FatalHint],
    default_hint: FatalHint,
    secrets: Iterable[str | None] = (),
) -> UploadError:
    """Error for a non-success response; `what` names the upload, e.g. "EMS upload of f.parquet"."""
    said = redact(body_excerpt(body), secrets) or "(empty body)"
    label = f"HTTP {status} {_phrase(status)}".rstrip()
    if is_retryable_status(status):
        return RetryableUploadError(
            f"{what} failed with {label}: {said}",
            status=status,
            reason=f"http_{status}",
            retry_after_s=retry_after_s,
        )
    hint = hints.get(status, default_hint)
    error = FatalUploadError(
        f"{what} was rejected with {label} and will not be retried: {hint.advice}. "
        f"Check {hint.setting}. Server said: {said}",
        status=status,
        reason=f"http_{status}",
        setting=hint.setting,
    )
    error.body = said
    return error


def is_certificate_failure(exc: BaseException) -> bool:
    """The peer's certificate did not verify (OpenSSL's reason, as requests and botocore both quote it).

    Unlike a handshake cut short by the network, retrying cannot help: a CA or the URL must change.
    """
    return "CERTIFICATE_VERIFY_FAILED" in str(exc)


def certificate_error(what: str, detail: str, url_setting: str) -> FatalUploadError:
    return FatalUploadError(
        f"{what}: the endpoint's TLS certificate could not be verified; this will not be retried. If the "
        f"endpoint (or an https proxy) uses a private or self-signed CA, set {CA_BUNDLE_SETTING} to a PEM "
        f"file holding that CA's certificate; otherwise check that the host in {url_setting} matches the "
        f"certificate. ({detail})",
        reason="tls_verify",
        setting=CA_BUNDLE_SETTING,
    )


def error_for_exception(
    exc: requests.RequestException,
    *,
    what: str,
    url_setting: str,
    header_setting: str,
    proxy_setting: str,
    secrets: Iterable[str | None] = (),
) -> UploadError:
    """Error for a request that got no HTTP answer: network trouble retries, bad input does not."""
    detail = redact(f"{type(exc).__name__}: {exc}", secrets)
    detail = detail if len(detail) <= BODY_LIMIT else detail[: BODY_LIMIT - 1] + "…"
    exceptions = requests.exceptions
    if isinstance(exc, exceptions.ProxyError) and "407" in str(exc):
        return FatalUploadError(
            f"{what}: the proxy refused our credentials (407) and this will not be retried. "
            f"Check {proxy_setting} and the proxy user name and password. ({detail})",
            reason="proxy_auth",
            setting=proxy_setting,
        )
    if is_certificate_failure(exc):  # an SSLError, or a ProxyError when an https proxy's certificate fails
        return certificate_error(what, detail, url_setting)
    for kind, reason in _TRANSIENT:
        if isinstance(exc, kind):
            return RetryableUploadError(f"{what} failed: {detail}", reason=reason)
    if isinstance(exc, exceptions.InvalidProxyURL):
        return _fatal(what, "the proxy URL is invalid", proxy_setting, "invalid_proxy", detail)
    if isinstance(exc, exceptions.InvalidHeader):
        return _fatal(what, "a header value is invalid", header_setting, "invalid_header", detail)
    if isinstance(exc, exceptions.InvalidSchema) and "SOCKS" in str(exc):
        return _fatal(what, "SOCKS proxies need PySocks", proxy_setting, "invalid_proxy", detail)
    if isinstance(exc, exceptions.InvalidURL | exceptions.InvalidSchema | exceptions.MissingSchema):
        return _fatal(what, "the endpoint URL is invalid", url_setting, "invalid_url", detail)
    return RetryableUploadError(f"{what} failed: {detail}", reason="request")


def _fatal(what: str, problem: str, setting: str, reason: str, detail: str) -> FatalUploadError:
    return FatalUploadError(
        f"{what}: {problem}; this will not be retried. Check {setting}. ({detail})",
        reason=reason,
        setting=setting,
    )


def _phrase(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return ""
