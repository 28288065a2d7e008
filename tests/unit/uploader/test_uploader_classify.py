"""The retry/fatal classification and Retry-After parsing, as pure functions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
import requests

from uploader.classify import (
    FatalHint,
    body_excerpt,
    error_for_exception,
    error_for_status,
    is_retryable_status,
    parse_retry_after,
)
from uploader.errors import FatalUploadError, RetryableUploadError

HINTS = {401: FatalHint("SINK_EMS_AUTHORIZATION", "fix the key")}
DEFAULT = FatalHint("SINK_EMS_ENDPOINT", "fix the URL")
NOW = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504, 599])
def test_retryable_statuses(status):
    assert is_retryable_status(status)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 405, 409, 413, 422, 499])
def test_fatal_statuses(status):
    assert not is_retryable_status(status)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("120", 120.0),
        (" 3 ", 3.0),
        ("0", 0.0),
        ("1.5", 1.5),
        (format_datetime(NOW + timedelta(seconds=90), usegmt=True), 90.0),
        ("Thu, 02 Jan 2025 03:04:35 GMT", 30.0),
        ("Thu, 02 Jan 2025 03:00:00 GMT", 0.0),  # in the past: retry now
        (None, None),
        ("", None),
        ("-5", None),
        ("soon", None),
        ("inf", None),
        ("nan", None),
    ],
)
def test_parse_retry_after(value, expected):
    assert parse_retry_after(value, now=NOW) == expected


def test_retryable_status_becomes_retryable_error():
    error = error_for_status(
        503, what="EMS upload of f", body="busy", retry_after_s=7, hints=HINTS, default_hint=DEFAULT
    )
    assert isinstance(error, RetryableUploadError)
    assert (error.status, error.reason, error.retry_after_s) == (503, "http_503", 7)
    assert (
        "EMS upload of f" in str(error) and "503 Service Unavailable" in str(error) and "busy" in str(error)
    )


def test_fatal_status_uses_the_hint_or_the_default():
    error = error_for_status(401, what="w", body="", retry_after_s=None, hints=HINTS, default_hint=DEFAULT)
    assert isinstance(error, FatalUploadError)
    assert error.setting == "SINK_EMS_AUTHORIZATION"
    assert "fix the key" in str(error) and "(empty body)" in str(error) and "not be retried" in str(error)
    other = error_for_status(
        418, what="w", body="teapot", retry_after_s=None, hints=HINTS, default_hint=DEFAULT
    )
    assert other.setting == "SINK_EMS_ENDPOINT" and other.reason == "http_418"


def test_server_body_is_redacted():
    error = error_for_status(
        400,
        what="w",
        body="got AppKey abcdefgh",
        retry_after_s=None,
        hints=HINTS,
        default_hint=DEFAULT,
        secrets=["AppKey abcdefgh", "abcdefgh"],
    )
    assert "abcdefgh" not in str(error)


def test_body_excerpt_spells_out_ems_500_json():
    assert body_excerpt('{"reference": "R-1", "message": "boom"}') == "boom (reference R-1)"


def test_body_excerpt_compacts_and_truncates():
    assert body_excerpt("  line one\n\n  line two  ") == "line one line two"
    assert body_excerpt('{"a": [1, 2]}') == '{"a":[1,2]}'
    long = body_excerpt("y" * 2000)
    assert len(long) == 500 and long.endswith("…")
    assert body_excerpt("{not json") == "{not json"


def _error(exc: requests.RequestException):
    return error_for_exception(
        exc, what="w", url_setting="URL", header_setting="HDR", proxy_setting="PROXY", secrets=["topsecret"]
    )


@pytest.mark.parametrize(
    ("exc", "reason"),
    [
        (requests.exceptions.ConnectTimeout("connect timed out"), "timeout"),
        (requests.exceptions.ReadTimeout("read timed out"), "timeout"),
        (requests.exceptions.ConnectionError("refused"), "connection"),
        (requests.exceptions.ChunkedEncodingError("cut"), "connection"),
        (requests.exceptions.SSLError("handshake"), "tls"),
        (requests.exceptions.ProxyError("Unable to connect to proxy"), "proxy"),
        (requests.exceptions.RetryError("odd"), "request"),
    ],
)
def test_network_failures_are_retryable(exc, reason):
    error = _error(exc)
    assert isinstance(error, RetryableUploadError)
    assert error.reason == reason and error.status is None


@pytest.mark.parametrize(
    ("exc", "setting"),
    [
        (
            requests.exceptions.ProxyError("Tunnel connection failed: 407 Proxy Authentication Required"),
            "PROXY",
        ),
        (requests.exceptions.InvalidProxyURL("bad proxy"), "PROXY"),
        (requests.exceptions.InvalidHeader("bad value 'AppKey topsecret\\n'"), "HDR"),
        (requests.exceptions.InvalidSchema("Missing dependencies for SOCKS support."), "PROXY"),
        (requests.exceptions.MissingSchema("no scheme"), "URL"),
        (requests.exceptions.InvalidURL("bad url"), "URL"),
    ],
)
def test_configuration_failures_are_fatal(exc, setting):
    error = _error(exc)
    assert isinstance(error, FatalUploadError)
    assert error.setting == setting
    assert "topsecret" not in str(error)
