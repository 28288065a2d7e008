"""Celonis EMS continuous-push target: one multipart POST per Parquet file.

Contract (BRIEF section 3): POST {endpoint}?targetName=..&clientId=..&connectionId=..
&fallbackVarcharLength=..&primaryKeys=a,b&duplicateRemovalOrderColumn=.. with the Authorization
header passed verbatim and one multipart part named `file`. 200 returns a JSON receipt.

Proxy: an explicit `proxy_url` is passed on every request and wins over HTTP(S)_PROXY/NO_PROXY from
the environment. Without it, requests' usual environment handling applies (HTTPS_PROXY, NO_PROXY,
REQUESTS_CA_BUNDLE), which is what container platforms expect. An explicit `ca_bundle`
(SINK_TLS_CA_BUNDLE) likewise wins over REQUESTS_CA_BUNDLE. ~/.netrc is never consulted: the
Authorization header is attached by our own auth hook, so netrc cannot replace it.
The environment is read once, when the target is built (requests walks all of `os.environ` twice
per request to do it, a cost every small file paid).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import pathlib
import time
from dataclasses import dataclass, field
from typing import Any, Self
from urllib.parse import quote, unquote, urlencode, urlsplit

import requests

from uploader.classify import (
    FatalHint,
    body_excerpt,
    error_for_exception,
    error_for_status,
    parse_retry_after,
)
from uploader.errors import FatalUploadError
from uploader.masking import MASK, authorization_secrets, mask_authorization, mask_userinfo, redact
from uploader.multipart import IN_MEMORY_MAX_BYTES, MultipartFileBody, multipart_bytes
from uploader.proxy import PROXY_SETTING, proxy_url_with_credentials, requests_proxies
from uploader.retry import OnRetry, RetryPolicy, call_with_retries
from uploader.target import FileMetadata, Receipt

log = logging.getLogger(__name__)

ENDPOINT_SETTING = "SINK_EMS_ENDPOINT"
AUTHORIZATION_SETTING = "SINK_EMS_AUTHORIZATION"
TABLE_SETTING = "SINK_EMS_TARGET_TABLE"
FILE_SIZE_SETTING = "SINK_FLUSH_BYTES"
ENDPOINT_SHAPE = "https://<team>.<realm>.celonis.cloud/continuous-batch-processing/api/v1/<pool-id>/items"
FILE_FIELD = "file"
FILE_CONTENT_TYPE = "application/octet-stream"

_HINTS = {
    400: FatalHint(
        TABLE_SETTING,
        "EMS refused the file for this table; check the table name and that the Parquet columns and "
        "types, including the primary-key and order columns, fit the table",
    ),
    401: FatalHint(
        AUTHORIZATION_SETTING,
        "EMS did not accept the credential; it must be `AppKey <key>` or `Bearer <token>`, valid "
        "for this team and realm",
    ),
    403: FatalHint(
        AUTHORIZATION_SETTING,
        "the credential is valid but may not push into this data pool; grant it access to the pool "
        "or use a key that has it",
    ),
    404: FatalHint(ENDPOINT_SETTING, f"no such endpoint; it must look like {ENDPOINT_SHAPE}"),
    407: FatalHint(
        PROXY_SETTING,
        "the proxy requires credentials; check the proxy user name and password",
    ),
    413: FatalHint(
        FILE_SIZE_SETTING,
        "the file is larger than EMS accepts; lower the file size threshold",
    ),
}
_DEFAULT_HINT = FatalHint(
    ENDPOINT_SETTING, f"EMS refused the request; the endpoint must look like {ENDPOINT_SHAPE}"
)


@dataclass(frozen=True)
class EmsSettings:
    """Frozen and hashable: the driver ships it to executors, which build their own EmsTarget."""

    endpoint: str
    authorization: str  # sent verbatim as the Authorization header ("AppKey ..." or "Bearer ...")
    client_id: str | None = None
    connection_id: str | None = None
    fallback_varchar_length: int | None = None
    proxy_url: str | None = None  # http://, https://, socks5:// (needs PySocks); may hold user:pass
    proxy_username: str | None = None
    proxy_password: str | None = None
    ca_bundle: str | None = None  # PEM file to verify the endpoint and proxy against; None: default CAs
    request_timeout_s: float = 60.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    def __post_init__(self) -> None:
        parts = urlsplit(self.endpoint)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"{ENDPOINT_SETTING} must be an http(s) URL like {ENDPOINT_SHAPE}")
        if not (self.authorization.isascii() and self.authorization.isprintable()):
            # Typically a trailing newline from a mounted secret file; http.client would reject it
            # later with the whole value in the message.
            raise ValueError(
                f"{AUTHORIZATION_SETTING} contains a line break or other non-printable character"
            )
        if self.request_timeout_s <= 0:
            raise ValueError("the EMS request timeout must be > 0 seconds")
        if self.proxy_url:
            self.effective_proxy_url()  # validates early, at startup rather than at the first upload
        elif self.proxy_username or self.proxy_password:
            raise ValueError(f"proxy credentials are set but {PROXY_SETTING} is not")

    def effective_proxy_url(self) -> str | None:
        """The proxy URL with credentials injected; None when no proxy is configured."""
        if not self.proxy_url:
            return None
        return proxy_url_with_credentials(self.proxy_url, self.proxy_username, self.proxy_password)

    def secrets(self) -> tuple[str, ...]:
        """Every string that must never appear in a log line or an error message."""
        proxy_url = self.effective_proxy_url()
        in_url = urlsplit(proxy_url).password if proxy_url else None
        in_url_decoded = unquote(in_url) if in_url else None
        values = (*authorization_secrets(self.authorization), self.proxy_password, in_url, in_url_decoded)
        return tuple(v for v in values if v)

    def __repr__(self) -> str:
        shown = []
        for f in dataclasses.fields(self):
            value: Any = getattr(self, f.name)
            if f.name == "authorization":
                value = mask_authorization(value)
            elif f.name == "proxy_password" and value is not None:
                value = MASK
            elif f.name == "proxy_url" and value:
                value = mask_userinfo(value)
            shown.append(f"{f.name}={value!r}")
        return f"EmsSettings({', '.join(shown)})"


class _VerbatimAuth(requests.auth.AuthBase):
    """Attach the header ourselves so ~/.netrc cannot override it; repr stays secret-free."""

    def __init__(self, value: str) -> None:
        self._value = value

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        request.headers["Authorization"] = self._value
        return request


class EmsTarget:
    """UploadTarget for EMS continuous push. Not thread-safe: use one per task/thread."""

    name = "ems"

    def __init__(self, settings: EmsSettings, session: requests.Session | None = None) -> None:
        """A session passed in stays owned by the caller and is not closed by close()."""
        self.settings = settings
        self._owns_session = session is None
        self._session = session if session is not None else requests.Session()
        proxy_url = settings.effective_proxy_url()
        self._proxies = requests_proxies(proxy_url) if proxy_url else None
        self._auth = _VerbatimAuth(settings.authorization)
        # Per request, not on the session: a session passed in belongs to the caller.
        self._verify: str | bool = settings.ca_bundle or True
        self._secrets = settings.secrets()
        # What requests would take from the environment on each request (proxies, CA bundle), merged
        # with the explicit settings and the session's once: the endpoint's host never changes.
        self._send_settings = self._session.merge_environment_settings(
            settings.endpoint, dict(self._proxies or {}), None, self._verify, None
        )
        if not settings.authorization.startswith(("AppKey ", "Bearer ")):
            log.warning(
                "%s does not start with `AppKey ` or `Bearer `; sending it verbatim anyway",
                AUTHORIZATION_SETTING,
            )

    def request_url(self, metadata: FileMetadata) -> str:
        """Endpoint plus the contract's query parameters, in a stable order; commas kept readable."""
        s = self.settings
        params: list[tuple[str, str]] = [("targetName", metadata.target_table)]
        if s.client_id:
            params.append(("clientId", s.client_id))
        if s.connection_id:
            params.append(("connectionId", s.connection_id))
        if s.fallback_varchar_length is not None:
            params.append(("fallbackVarcharLength", str(s.fallback_varchar_length)))
        if metadata.primary_keys:
            params.append(("primaryKeys", ",".join(metadata.primary_keys)))
            # EMS only uses the order column to pick a winner among rows with the same key.
            if metadata.order_column:
                params.append(("duplicateRemovalOrderColumn", metadata.order_column))
        separator = "&" if "?" in s.endpoint else "?"
        return f"{s.endpoint}{separator}{urlencode(params, safe=',', quote_via=quote)}"

    def upload(self, path: pathlib.Path, metadata: FileMetadata, on_retry: OnRetry | None = None) -> Receipt:
        """POST the file, retrying transient failures within the policy's time budget."""
        path = pathlib.Path(path)
        size = path.stat().st_size
        what = f"EMS upload of {metadata.file_name()} ({size} bytes, table {metadata.target_table!r})"
        if not metadata.target_table:
            raise FatalUploadError(
                f"{what}: the target table name is empty. Check {TABLE_SETTING}.",
                reason="no_table",
                setting=TABLE_SETTING,
            )
        url = self.request_url(metadata)
        started = time.monotonic()
        answer, attempts = call_with_retries(
            lambda attempt: self._post(path, size, metadata, url, what, attempt), self.settings.retry, on_retry
        )
        response_id = answer.get("id")
        response_id = None if response_id is None else str(response_id)
        return Receipt(
            target=self.name,
            location=response_id or self.settings.endpoint,
            response_id=response_id,
            bytes=size,
            attempts=attempts,
            duration_s=time.monotonic() - started,
            details=answer,
        )

    def describe_request(self, path: pathlib.Path, metadata: FileMetadata) -> dict[str, Any]:
        """What upload() would send, secrets masked; for a --dry-run that touches no network."""
        path = pathlib.Path(path)
        proxy_url = self.settings.effective_proxy_url()
        return {
            "method": "POST",
            "url": self.request_url(metadata),
            "headers": {
                "Authorization": mask_authorization(self.settings.authorization),
                "Content-Type": "multipart/form-data; boundary=<random per request>",
            },
            "file_field": FILE_FIELD,
            "file_name": metadata.file_name(),
            "file_content_type": FILE_CONTENT_TYPE,
            "file_path": str(path),
            "file_size": path.stat().st_size,
            "proxy": proxy_url and mask_userinfo(proxy_url),
            "ca_bundle": self.settings.ca_bundle,
            "timeout_s": self.settings.request_timeout_s,
            "retry": dataclasses.asdict(self.settings.retry),
        }

    def close(self) -> None:
        if self._owns_session:
            self._session.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _post(self, path: pathlib.Path, size: int, metadata: FileMetadata, url: str, what: str, attempt: int) -> dict:
        """One attempt. A fresh body each time: the previous attempt consumed the stream."""
        log.debug("%s: attempt %d", what, attempt)
        with contextlib.ExitStack() as stack:
            body: bytes | MultipartFileBody
            if size <= IN_MEMORY_MAX_BYTES:
                body, content_type = multipart_bytes(
                    path, field_name=FILE_FIELD, file_name=metadata.file_name(), content_type=FILE_CONTENT_TYPE
                )
            else:
                body = stack.enter_context(MultipartFileBody(
                    path, field_name=FILE_FIELD, file_name=metadata.file_name(), content_type=FILE_CONTENT_TYPE
                ))
                content_type = body.content_type
            try:
                request = self._session.prepare_request(requests.Request(
                    "POST", url, data=body, headers={"Content-Type": content_type}, auth=self._auth
                ))
                response = self._session.send(
                    request,
                    timeout=self.settings.request_timeout_s,
                    # A redirect would drop the body or the credential; better to say so plainly.
                    allow_redirects=False,
                    **self._send_settings,
                )
            except requests.RequestException as exc:
                # `from None`: the library's own message may quote a header or proxy URL verbatim.
                raise error_for_exception(
                    exc,
                    what=what,
                    url_setting=ENDPOINT_SETTING,
                    header_setting=AUTHORIZATION_SETTING,
                    proxy_setting=PROXY_SETTING,
                    secrets=self._secrets,
                ) from None
            except ValueError as exc:  # http.client's header and URL checks, message may quote values
                setting = AUTHORIZATION_SETTING if "header" in str(exc).lower() else ENDPOINT_SETTING
                raise FatalUploadError(
                    f"{what}: the request could not be built ({redact(str(exc), self._secrets)}). "
                    f"Check {setting}.",
                    reason="invalid_request",
                    setting=setting,
                ) from None
        with response:
            return self._answer(response, what)

    def _answer(self, response: requests.Response, what: str) -> dict:
        status = response.status_code
        if 200 <= status < 300:
            try:
                answer = response.json()
            except ValueError:
                answer = None
            if isinstance(answer, dict):
                return answer
            said = redact(body_excerpt(response.text), self._secrets) or "(empty body)"
            raise FatalUploadError(
                f"{what}: EMS answered HTTP {status} without its JSON receipt "
                f"(Content-Type {response.headers.get('Content-Type')!r}: {said}); the file may or may "
                f"not have been stored. Check {ENDPOINT_SETTING}: it must look like {ENDPOINT_SHAPE}",
                status=status,
                reason="protocol",
                setting=ENDPOINT_SETTING,
            )
        if 300 <= status < 400:
            location = redact(response.headers.get("Location", "(no Location)"), self._secrets)
            raise FatalUploadError(
                f"{what}: EMS redirected with HTTP {status} to {location}; redirects are not followed "
                f"because they would drop the file or the credential. Set {ENDPOINT_SETTING} to the "
                f"final URL",
                status=status,
                reason=f"http_{status}",
                setting=ENDPOINT_SETTING,
            )
        raise error_for_status(
            status,
            what=what,
            body=response.text,
            retry_after_s=parse_retry_after(response.headers.get("Retry-After")),
            hints=_HINTS,
            default_hint=_DEFAULT_HINT,
            secrets=self._secrets,
        )
