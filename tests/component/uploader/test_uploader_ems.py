"""EmsTarget against a real local HTTP server that records requests and replays a scripted answer list."""

from __future__ import annotations

import base64
import http.server
import io
import json
import logging
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import requests
from werkzeug.formparser import parse_form_data

from tests.support.uploader_fixtures import metadata_builder
from uploader.ems import EmsSettings, EmsTarget
from uploader.errors import FatalUploadError, RetriesExhaustedError, RetryableUploadError, UploadError
from uploader.multipart import IN_MEMORY_MAX_BYTES
from uploader.retry import RetryPolicy
from uploader.target import UploadTarget

SECRET_KEY = "s3cr3t-app-key-0123456789"
AUTH = f"AppKey {SECRET_KEY}"
PROXY_PASSWORD = "p@ss:w0rd/!"
FAST = RetryPolicy(max_elapsed_s=5.0, initial_backoff_s=0.01, max_backoff_s=0.05)


@dataclass
class Seen:
    method: str
    path: str  # absolute URL when the server is used as a proxy
    headers: dict[str, str]
    body: bytes
    at: float  # time.monotonic() on arrival

    @property
    def query(self) -> dict[str, list[str]]:
        return parse_qs(urlsplit(self.path).query, keep_blank_values=True)

    def form_files(self):
        """Parse the body with werkzeug, an independent multipart implementation."""
        environ = {
            "wsgi.input": io.BytesIO(self.body),
            "CONTENT_LENGTH": str(len(self.body)),
            "CONTENT_TYPE": self.headers["Content-Type"],
            "REQUEST_METHOD": "POST",
        }
        _, form, files = parse_form_data(environ)
        return form, files


@dataclass
class Answer:
    status: int = 200
    body: bytes | str | dict = field(
        default_factory=lambda: {"id": "resp-1", "fileName": "f", "bucketId": "b", "flushStatus": "NEW"}
    )
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


class EmsStub:
    """ThreadingHTTPServer on an ephemeral port; answers from `script`, then `default`."""

    def __init__(self) -> None:
        self.seen: list[Seen] = []
        self.script: deque[Answer] = deque()
        self.default = Answer()
        self._stopping = threading.Event()
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                stub.seen.append(Seen(self.command, self.path, dict(self.headers), body, time.monotonic()))
                answer = stub.script.popleft() if stub.script else stub.default
                if answer.delay_s and stub._stopping.wait(answer.delay_s):
                    return
                payload = answer.body
                if isinstance(payload, dict):
                    payload = json.dumps(payload)
                if isinstance(payload, str):
                    payload = payload.encode()
                try:
                    self.send_response(answer.status)
                    for name, value in answer.headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except OSError:
                    pass  # the client gave up (timeout test)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)

    def endpoint(self) -> str:
        return f"{self.url}/continuous-batch-processing/api/v1/pool-1/items"

    def start(self) -> EmsStub:
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture(autouse=True)
def no_proxy_env(monkeypatch):
    for name in (
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "NO_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
        "no_proxy",
    ):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def stub():
    server = EmsStub().start()
    yield server
    server.stop()


@pytest.fixture
def parquet_file(tmp_path) -> Path:
    path = tmp_path / "scratch.parquet"
    table = pa.table({"id": [1, 2, 3], "status": ["new", "paid", "sent"], "offset": [10, 11, 12]})
    pq.write_table(table, path)
    return path


metadata = metadata_builder(target_table="ORDERS", primary_keys=("id", "tenant"), order_column="offset")


def target(stub: EmsStub, **overrides) -> EmsTarget:
    values = dict(
        endpoint=stub.endpoint(), authorization=AUTH, client_id="sink-test", retry=FAST, request_timeout_s=5.0
    )
    values.update(overrides)
    return EmsTarget(EmsSettings(**values))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_no_secret(text: str) -> None:
    assert SECRET_KEY not in text
    assert PROXY_PASSWORD not in text


# --- the request itself -------------------------------------------------------------------------------


def test_is_an_upload_target(stub):
    assert isinstance(target(stub), UploadTarget)
    assert target(stub).name == "ems"


def test_posts_one_file_part_with_the_parquet_bytes(stub, parquet_file):
    with target(stub) as ems:
        receipt = ems.upload(parquet_file, metadata())

    (seen,) = stub.seen
    assert seen.method == "POST"
    assert urlsplit(seen.path).path == "/continuous-batch-processing/api/v1/pool-1/items"
    assert int(seen.headers["Content-Length"]) == len(seen.body)
    assert "Transfer-Encoding" not in seen.headers
    form, files = seen.form_files()
    assert not form
    assert list(files.keys()) == ["file"]
    (part,) = files.getlist("file")
    assert part.filename == "topic-orders_partition-3_firstOffset-10_lastOffset-12.parquet"
    assert part.content_type == "application/octet-stream"
    sent = part.read()
    assert sent == parquet_file.read_bytes()
    assert pq.read_table(io.BytesIO(sent)).column("status").to_pylist() == ["new", "paid", "sent"]
    # Exactly one part: one opening delimiter plus the closing one.
    boundary = seen.headers["Content-Type"].split("boundary=")[1].encode()
    assert seen.body.count(b"--" + boundary) == 2

    assert receipt.target == "ems"
    assert receipt.response_id == "resp-1"
    assert receipt.location == "resp-1"
    assert receipt.bytes == parquet_file.stat().st_size
    assert receipt.attempts == 1
    assert receipt.duration_s > 0
    assert receipt.details["flushStatus"] == "NEW"


def test_large_file_is_streamed_intact(stub, tmp_path):
    path = tmp_path / "big.parquet"
    data = bytes(range(256)) * (5 * 4096 + 7)  # ~5 MB, not a multiple of the chunk size
    path.write_bytes(data)
    target(stub).upload(path, metadata())
    _, files = stub.seen[0].form_files()
    assert files["file"].read() == data


@pytest.mark.parametrize("extra", [-1, 0, 1], ids=["below", "at", "above"])
def test_files_around_the_in_memory_bound_arrive_intact_with_one_wire_format(stub, tmp_path, extra):
    # Up to IN_MEMORY_MAX_BYTES the body is one bytes object, above it a stream: same parts, same lengths.
    path = tmp_path / "edge.parquet"
    data = bytes(range(251)) * (IN_MEMORY_MAX_BYTES // 251) + b"x" * (IN_MEMORY_MAX_BYTES % 251 + extra)
    path.write_bytes(data)
    target(stub).upload(path, metadata())
    seen = stub.seen[0]
    _, files = seen.form_files()
    assert files["file"].read() == data
    assert files["file"].filename == metadata().file_name()
    assert files["file"].content_type == "application/octet-stream"
    assert int(seen.headers["Content-Length"]) == len(seen.body)
    assert "Transfer-Encoding" not in seen.headers


def test_the_environment_is_read_when_the_target_is_built(stub, parquet_file, monkeypatch):
    # requests walked os.environ twice per upload for proxies and CA bundles; the target reads it once.
    ems = target(stub)
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    assert ems.upload(parquet_file, metadata()).attempts == 1
    assert len(stub.seen) == 1


def test_query_parameters_follow_the_contract(stub, parquet_file):
    ems = target(stub, connection_id="conn-9", fallback_varchar_length=255)
    ems.upload(parquet_file, metadata(target_table="ORDERS TABLE"))
    seen = stub.seen[0]
    assert seen.query == {
        "targetName": ["ORDERS TABLE"],
        "clientId": ["sink-test"],
        "connectionId": ["conn-9"],
        "fallbackVarcharLength": ["255"],
        "primaryKeys": ["id,tenant"],
        "duplicateRemovalOrderColumn": ["offset"],
    }
    assert "primaryKeys=id,tenant" in urlsplit(seen.path).query


def test_without_primary_keys_no_key_or_order_parameter(stub, parquet_file):
    ems = target(stub, client_id=None)
    ems.upload(parquet_file, metadata(primary_keys=(), order_column="offset"))
    assert stub.seen[0].query == {"targetName": ["ORDERS"]}


def test_primary_keys_without_order_column(stub, parquet_file):
    target(stub).upload(parquet_file, metadata(primary_keys=("id",), order_column=None))
    query = stub.seen[0].query
    assert query["primaryKeys"] == ["id"]
    assert "duplicateRemovalOrderColumn" not in query


@pytest.mark.parametrize("authorization", [AUTH, "Bearer eyJhbGciOi.JIUzI1NiJ9.x-y_z"])
def test_authorization_is_sent_verbatim(stub, parquet_file, authorization):
    target(stub, authorization=authorization).upload(parquet_file, metadata())
    assert stub.seen[0].headers["Authorization"] == authorization


def test_netrc_cannot_replace_the_authorization(stub, parquet_file, tmp_path, monkeypatch):
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login someone password other\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    target(stub).upload(parquet_file, metadata())
    assert stub.seen[0].headers["Authorization"] == AUTH


def test_describe_request_masks_the_credential(stub, parquet_file):
    ems = target(stub, proxy_url="http://proxy.local:3128", proxy_username="u", proxy_password=PROXY_PASSWORD)
    described = ems.describe_request(parquet_file, metadata())
    assert described["method"] == "POST"
    assert described["url"].startswith(stub.endpoint() + "?targetName=ORDERS&clientId=sink-test")
    assert described["headers"]["Authorization"] == "AppKey ***"
    assert described["file_name"] == "topic-orders_partition-3_firstOffset-10_lastOffset-12.parquet"
    assert described["file_size"] == parquet_file.stat().st_size
    assert described["proxy"] == "http://***@proxy.local:3128"
    assert_no_secret(json.dumps(described))
    assert not stub.seen


# --- retries ------------------------------------------------------------------------------------------


def test_503_503_200_succeeds_on_the_third_attempt(stub, parquet_file):
    stub.script.extend([Answer(503, "busy"), Answer(503, "busy"), Answer()])
    receipt = target(stub).upload(parquet_file, metadata())
    assert receipt.attempts == 3
    assert len(stub.seen) == 3
    # Each attempt re-sends the whole file, not an exhausted stream.
    assert all(s.form_files()[1]["file"].read() == parquet_file.read_bytes() for s in stub.seen)


def test_retry_after_is_honoured(stub, parquet_file):
    stub.script.extend([Answer(429, "slow down", headers={"Retry-After": "1"}), Answer()])
    receipt = target(stub).upload(parquet_file, metadata())
    assert receipt.attempts == 2
    assert stub.seen[1].at - stub.seen[0].at >= 1.0


def test_retries_are_logged_without_secrets(stub, parquet_file, caplog):
    stub.script.extend([Answer(503, f"echo {AUTH}"), Answer()])
    with caplog.at_level(logging.WARNING, logger="uploader"):
        target(stub).upload(parquet_file, metadata())
    (record,) = [r for r in caplog.records if r.name.startswith("uploader")]
    assert record.levelno == logging.WARNING
    assert "http_503" in record.getMessage()
    assert "retrying in" in record.getMessage()
    assert_no_secret(record.getMessage())


def test_budget_exhaustion_raises_retries_exhausted(stub, parquet_file):
    stub.default = Answer(500, {"reference": "ref-42", "message": "database unavailable"})
    policy = RetryPolicy(max_elapsed_s=0.4, initial_backoff_s=0.01, max_backoff_s=0.05)
    started = time.monotonic()
    with pytest.raises(RetriesExhaustedError) as caught:
        target(stub, retry=policy).upload(parquet_file, metadata())
    assert time.monotonic() - started < 2.0
    error = caught.value
    assert error.retryable and isinstance(error, RetryableUploadError)
    assert error.status == 500
    assert error.reason == "http_500"
    assert error.attempts == len(stub.seen) >= 2
    assert "ref-42" in str(error) and "database unavailable" in str(error)
    assert f"after {error.attempts} attempt" in str(error)


def test_retry_after_beyond_the_budget_gives_up_at_once(stub, parquet_file):
    stub.default = Answer(503, "maintenance", headers={"Retry-After": "3600"})
    started = time.monotonic()
    with pytest.raises(RetriesExhaustedError) as caught:
        target(stub).upload(parquet_file, metadata())
    assert time.monotonic() - started < 1.0
    assert len(stub.seen) == 1
    assert caught.value.retry_after_s == 3600


def test_connection_refused_is_retryable(parquet_file):
    port = free_port()
    settings = EmsSettings(
        endpoint=f"http://127.0.0.1:{port}/items",
        authorization=AUTH,
        retry=RetryPolicy(max_elapsed_s=5, initial_backoff_s=0.01, max_attempts=3),
    )
    with pytest.raises(RetriesExhaustedError) as caught:
        EmsTarget(settings).upload(parquet_file, metadata())
    assert caught.value.reason == "connection"
    assert caught.value.attempts == 3
    assert caught.value.status is None


def test_timeout_is_retryable(stub, parquet_file):
    stub.script.extend([Answer(delay_s=2.0), Answer()])
    receipt = target(stub, request_timeout_s=0.3).upload(parquet_file, metadata())
    assert receipt.attempts == 2


def test_timeouts_until_the_budget_runs_out(stub, parquet_file):
    stub.default = Answer(delay_s=2.0)
    policy = RetryPolicy(max_elapsed_s=5, initial_backoff_s=0.01, max_attempts=2)
    with pytest.raises(RetriesExhaustedError) as caught:
        target(stub, request_timeout_s=0.2, retry=policy).upload(parquet_file, metadata())
    assert caught.value.reason == "timeout"
    assert len(stub.seen) == 2


# --- fatal answers ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "setting", "body"),
    [
        (400, "SINK_EMS_TARGET_TABLE", "Column 'amount' has incompatible type"),
        (401, "SINK_EMS_AUTHORIZATION", ""),
        (403, "SINK_EMS_AUTHORIZATION", '{"message": "no permission for pool"}'),
        (404, "SINK_EMS_ENDPOINT", "Not Found"),
        (413, "SINK_FLUSH_BYTES", "Request Entity Too Large"),
        (407, "SINK_EMS_PROXY_URL", ""),
        (422, "SINK_EMS_ENDPOINT", "unprocessable"),
    ],
)
def test_client_errors_are_fatal_after_one_request(stub, parquet_file, status, setting, body):
    stub.default = Answer(status, body)
    with pytest.raises(FatalUploadError) as caught:
        target(stub).upload(parquet_file, metadata())
    error = caught.value
    assert len(stub.seen) == 1
    assert not error.retryable
    assert error.status == status
    assert error.setting == setting
    assert error.reason == f"http_{status}"
    assert setting in str(error)
    assert "topic-orders_partition-3_firstOffset-10_lastOffset-12.parquet" in str(error)
    if body.startswith("{"):
        assert "no permission for pool" in str(error)
    elif body:
        assert body in str(error)
    assert_no_secret(str(error))


def test_400_body_is_truncated(stub, parquet_file):
    stub.default = Answer(400, "x" * 5000)
    with pytest.raises(FatalUploadError) as caught:
        target(stub).upload(parquet_file, metadata())
    assert 500 <= len(str(caught.value)) < 1000


def test_200_without_json_is_a_fatal_protocol_error(stub, parquet_file):
    stub.default = Answer(200, "<html>login</html>", headers={"Content-Type": "text/html"})
    with pytest.raises(FatalUploadError) as caught:
        target(stub).upload(parquet_file, metadata())
    assert caught.value.reason == "protocol"
    assert caught.value.setting == "SINK_EMS_ENDPOINT"
    assert "<html>login</html>" in str(caught.value)
    assert len(stub.seen) == 1


def test_redirects_are_not_followed(stub, parquet_file):
    stub.default = Answer(302, "", headers={"Location": "https://elsewhere.example/items"})
    with pytest.raises(FatalUploadError) as caught:
        target(stub).upload(parquet_file, metadata())
    assert caught.value.setting == "SINK_EMS_ENDPOINT"
    assert "https://elsewhere.example/items" in str(caught.value)
    assert len(stub.seen) == 1


def test_empty_table_name_is_fatal_without_a_request(stub, parquet_file):
    with pytest.raises(FatalUploadError) as caught:
        target(stub).upload(parquet_file, metadata(target_table=""))
    assert caught.value.setting == "SINK_EMS_TARGET_TABLE"
    assert not stub.seen


def test_missing_file_is_not_an_upload_error(stub, tmp_path):
    with pytest.raises(FileNotFoundError):
        target(stub).upload(tmp_path / "gone.parquet", metadata())


# --- secrets ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [400, 401, 500])
def test_echoed_credentials_are_redacted_from_errors(stub, parquet_file, status):
    stub.default = Answer(status, f"bad header Authorization: {AUTH} (key {SECRET_KEY})")
    policy = RetryPolicy(max_elapsed_s=0.2, initial_backoff_s=0.01)
    with pytest.raises(UploadError) as caught:
        target(stub, retry=policy).upload(parquet_file, metadata())
    assert_no_secret(str(caught.value))
    assert "***" in str(caught.value)


@pytest.mark.parametrize("authorization", [f"AppKey {SECRET_KEY}\n", f"AppKey {SECRET_KEY}\u00e9"])
def test_unsendable_authorization_is_rejected_without_echoing_it(authorization):
    with pytest.raises(ValueError, match="SINK_EMS_AUTHORIZATION") as caught:
        EmsSettings(endpoint="https://t.r.celonis.cloud/items", authorization=authorization)
    assert_no_secret(str(caught.value))


def test_settings_repr_masks_secrets():
    settings = EmsSettings(
        endpoint="https://team.eu-1.celonis.cloud/continuous-batch-processing/api/v1/p/items",
        authorization=AUTH,
        proxy_url=f"http://alice:{PROXY_PASSWORD.replace('/', '%2F')}@proxy:3128",
        proxy_password=PROXY_PASSWORD,
    )
    for text in (repr(settings), str(settings)):
        assert_no_secret(text)
        assert "AppKey ***" in text
    assert hash(settings) == hash(
        EmsSettings(**{f: getattr(settings, f) for f in settings.__dataclass_fields__})
    )


@pytest.mark.parametrize(
    ("kwargs", "mentions"),
    [
        ({"endpoint": "ftp://x/items"}, "SINK_EMS_ENDPOINT"),
        ({"endpoint": "team.celonis.cloud/items"}, "SINK_EMS_ENDPOINT"),
        ({"proxy_url": "ftp://proxy:21"}, "SINK_EMS_PROXY_URL"),
        ({"proxy_password": "x"}, "SINK_EMS_PROXY_URL"),
        ({"request_timeout_s": 0}, "timeout"),
    ],
)
def test_settings_are_validated_early(kwargs, mentions):
    values = {"endpoint": "https://t.r.celonis.cloud/items", "authorization": AUTH, **kwargs}
    with pytest.raises(ValueError, match=mentions):
        EmsSettings(**values)


def test_socks_proxy_is_accepted():
    settings = EmsSettings(
        endpoint="https://t.r.celonis.cloud/items", authorization=AUTH, proxy_url="socks5h://proxy:1080"
    )
    assert settings.effective_proxy_url() == "socks5h://proxy:1080"


# --- proxy --------------------------------------------------------------------------------------------


def test_explicit_proxy_is_used_with_credentials(stub, parquet_file, monkeypatch):
    # The environment points elsewhere and says "no proxy"; the explicit setting must still win.
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("NO_PROXY", "*")
    endpoint = "http://ems.invalid/continuous-batch-processing/api/v1/pool-1/items"
    ems = EmsTarget(
        EmsSettings(
            endpoint=endpoint,
            authorization=AUTH,
            retry=FAST,
            proxy_url=stub.url,
            proxy_username="proxy user",
            proxy_password=PROXY_PASSWORD,
        )
    )
    receipt = ems.upload(parquet_file, metadata())
    assert receipt.response_id == "resp-1"
    (seen,) = stub.seen
    assert seen.path.startswith(endpoint + "?targetName=ORDERS")  # absolute-form: it went via the proxy
    expected = base64.b64encode(f"proxy user:{PROXY_PASSWORD}".encode()).decode()
    assert seen.headers["Proxy-Authorization"] == f"Basic {expected}"
    assert seen.headers["Authorization"] == AUTH


def test_environment_proxy_applies_without_explicit_setting(stub, parquet_file, monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", stub.url)
    endpoint = "http://ems.invalid/items"
    EmsTarget(EmsSettings(endpoint=endpoint, authorization=AUTH, retry=FAST)).upload(parquet_file, metadata())
    assert stub.seen[0].path.startswith(endpoint)


def test_unreachable_proxy_is_retryable(parquet_file):
    settings = EmsSettings(
        endpoint="http://ems.invalid/items",
        authorization=AUTH,
        proxy_url=f"http://127.0.0.1:{free_port()}",
        proxy_password=PROXY_PASSWORD,
        proxy_username="u",
        retry=RetryPolicy(initial_backoff_s=0.01, max_attempts=2),
    )
    with pytest.raises(RetriesExhaustedError) as caught:
        EmsTarget(settings).upload(parquet_file, metadata())
    assert caught.value.reason == "proxy"
    assert_no_secret(str(caught.value))


# --- session ownership --------------------------------------------------------------------------------


def test_close_leaves_a_caller_session_open(stub, parquet_file):
    session = requests.Session()
    closed = []
    session.close = lambda: closed.append(True)  # type: ignore[method-assign]
    ems = EmsTarget(EmsSettings(endpoint=stub.endpoint(), authorization=AUTH, retry=FAST), session=session)
    ems.upload(parquet_file, metadata())
    ems.close()
    assert not closed
