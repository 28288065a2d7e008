"""S3Target against moto's real HTTP server, and against a tiny scripted S3 for the failure cases."""

from __future__ import annotations

import hashlib
import http.server
import os
import pickle
import socket
import threading
import time
import uuid
from collections import deque
from pathlib import Path

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sink_service.config import ConfigError, load_config
from sink_service.config.upload_targets import build_target, target_settings
from tests.support.uploader_fixtures import metadata_builder
from uploader.errors import FatalUploadError, RetriesExhaustedError, RetryableUploadError
from uploader.retry import RetryPolicy
from uploader.s3 import S3Target, object_metadata
from uploader.s3_settings import BUCKET_SETTING, CREDENTIALS_SETTING, MIB, REGION_SETTING, S3Settings
from uploader.target import UploadTarget

pytestmark = pytest.mark.usefixtures("aws_env")  # dummy credentials, nothing from the machine

FAST = RetryPolicy(max_elapsed_s=3.0, initial_backoff_s=0.01, max_backoff_s=0.05)
REGION = "us-east-1"


@pytest.fixture
def bucket(moto_url) -> str:
    name = f"sink-{uuid.uuid4().hex[:12]}"  # moto keeps one store per process: no sharing across tests
    raw_client(moto_url).create_bucket(Bucket=name)
    return name


def raw_client(url: str):
    return boto3.client("s3", endpoint_url=url, region_name=REGION)


def settings(url: str, bucket: str, **overrides) -> S3Settings:
    values = dict(bucket=bucket, prefix="raw/", endpoint_url=url, region=REGION, retry=FAST, request_timeout_s=5.0)
    values.update(overrides)
    return S3Settings(**values)


metadata = metadata_builder(primary_keys=("id", "tenant"))


@pytest.fixture
def parquet_file(tmp_path) -> Path:
    path = tmp_path / "scratch.parquet"
    pq.write_table(pa.table({"id": [1, 2, 3], "tenant": ["a", "a", "b"], "_offset": [10, 11, 12]}), path)
    return path


KEY = "raw/orders/3/00000000000000000010-00000000000000000012.parquet"


# --- against moto's HTTP server ----------------------------------------------------------------------


def test_is_an_upload_target(moto_url, bucket):
    with S3Target(settings(moto_url, bucket)) as target:
        assert isinstance(target, UploadTarget)
        assert target.name == "s3"


def test_upload_writes_the_deterministic_key_with_metadata(moto_url, bucket, parquet_file):
    with S3Target(settings(moto_url, bucket)) as target:
        receipt = target.upload(parquet_file, metadata())
    client = raw_client(moto_url)
    assert [o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]] == [KEY]
    head = client.head_object(Bucket=bucket, Key=KEY)
    assert head["Metadata"] == {
        "topic": "orders",
        "partition": "3",
        "first-offset": "10",
        "last-offset": "12",
        "record-count": "3",
        "schema-fingerprint": "abc123",
        "primary-keys": "id,tenant",
        "order-column": "_offset",
    }
    assert head["ContentType"] == "application/vnd.apache.parquet"
    body = client.get_object(Bucket=bucket, Key=KEY)["Body"].read()
    assert body == parquet_file.read_bytes()
    assert receipt.target == "s3"
    assert receipt.location == f"s3://{bucket}/{KEY}"
    assert receipt.response_id == head["ETag"].strip('"')
    assert receipt.bytes == parquet_file.stat().st_size
    assert receipt.attempts == 1
    assert receipt.details["multipart"] is False


def test_large_file_goes_up_in_parts(moto_url, bucket, tmp_path):
    path = tmp_path / "big.parquet"
    data = os.urandom(11 * MIB)  # incompressible, so 3 parts of 5 MiB: 5 + 5 + 1
    path.write_bytes(data)
    with S3Target(settings(moto_url, bucket, part_size=5 * MIB)) as target:
        started = time.monotonic()
        receipt = target.upload(path, metadata())
        elapsed = time.monotonic() - started
    print(f"multipart upload of {len(data) / MIB:.0f} MiB to moto took {elapsed:.2f}s")
    client = raw_client(moto_url)
    head = client.head_object(Bucket=bucket, Key=KEY)
    assert head["ETag"].strip('"').endswith("-3")  # S3's multipart ETag: md5 of the part md5s, "-<parts>"
    assert head["ContentLength"] == len(data)
    assert head["Metadata"]["record-count"] == "3"  # metadata travels with CreateMultipartUpload
    body = client.get_object(Bucket=bucket, Key=KEY)["Body"].read()
    assert hashlib.sha256(body).digest() == hashlib.sha256(data).digest()
    assert receipt.details["multipart"] is True
    assert receipt.response_id == head["ETag"].strip('"')
    assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_reupload_overwrites_the_same_key(moto_url, bucket, tmp_path):
    first, second = tmp_path / "first.parquet", tmp_path / "second.parquet"
    pq.write_table(pa.table({"id": [1], "_offset": [10]}), first)
    pq.write_table(pa.table({"id": [1, 2], "_offset": [10, 11]}), second)
    with S3Target(settings(moto_url, bucket)) as target:
        target.upload(first, metadata())
        target.upload(second, metadata())  # a replay of the same range after a crash
    client = raw_client(moto_url)
    listing = client.list_objects_v2(Bucket=bucket)["Contents"]
    assert [o["Key"] for o in listing] == [KEY]
    assert client.get_object(Bucket=bucket, Key=KEY)["Body"].read() == second.read_bytes()


def test_versioned_bucket_receipt_carries_the_version_id(moto_url, bucket, parquet_file):
    client = raw_client(moto_url)
    client.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    with S3Target(settings(moto_url, bucket, prefix="")) as target:
        receipt = target.upload(parquet_file, metadata())
    key = metadata().object_key()
    head = client.head_object(Bucket=bucket, Key=key)
    assert receipt.response_id == head["VersionId"]
    assert receipt.details["etag"] == head["ETag"].strip('"')


def test_missing_bucket_is_fatal_and_names_the_bucket_setting(moto_url, parquet_file):
    target = S3Target(settings(moto_url, "no-such-bucket-here"))
    started = time.monotonic()
    with pytest.raises(FatalUploadError) as caught:
        target.upload(parquet_file, metadata())
    assert time.monotonic() - started < FAST.max_elapsed_s  # not retried until the budget ran out
    assert caught.value.setting == BUCKET_SETTING == "SINK_S3_BUCKET"
    assert "NoSuchBucket" in str(caught.value)
    assert "SINK_S3_BUCKET" in str(caught.value)


def test_missing_credentials_are_fatal(moto_url, bucket, parquet_file, monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(FatalUploadError) as caught:
        S3Target(settings(moto_url, bucket)).upload(parquet_file, metadata())
    assert caught.value.setting == CREDENTIALS_SETTING
    assert "AWS_ACCESS_KEY_ID" in str(caught.value)


def test_connection_refused_is_retryable(parquet_file):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # A budget the first attempt cannot use up alone: on a slow host it took 0.4-0.5 s (botocore's first
    # request), and with 0.3 s no second attempt came (29 Nov 2026, four runs out of four).
    fast = RetryPolicy(max_elapsed_s=2.0, initial_backoff_s=0.01, max_backoff_s=0.02)
    target = S3Target(settings(f"http://127.0.0.1:{port}", "b", retry=fast, request_attempts=1))
    with pytest.raises(RetriesExhaustedError) as caught:
        target.upload(parquet_file, metadata())
    assert caught.value.reason == "connection"
    assert caught.value.attempts >= 2


# --- against a scripted S3: statuses moto does not produce on demand --------------------------------


class ScriptedS3:
    """Answers PUTs from `script` (status, error code) and then with 200 + an ETag; counts requests."""

    def __init__(self) -> None:
        self.script: deque[tuple[int, str | None]] = deque()
        self.default: tuple[int, str | None] = (200, None)
        self.requests: list[str] = []
        self.delay_s = 0.0
        self._stop = threading.Event()
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_PUT(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                stub.requests.append(self.path)
                if stub.delay_s and stub._stop.wait(stub.delay_s):
                    return
                status, code = stub.script.popleft() if stub.script else stub.default
                if code is None:
                    body = b""
                else:
                    body = (
                        f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                        f"<Message>scripted {code}</Message><RequestId>req-{len(stub.requests)}</RequestId>"
                        "</Error>"
                    ).encode()
                try:
                    self.send_response(status)
                    if status == 200:
                        self.send_header("ETag", '"0123456789abcdef"')
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def scripted():
    server = ScriptedS3()
    yield server
    server.stop()


def scripted_target(server: ScriptedS3, **overrides) -> S3Target:
    values = dict(request_attempts=1)
    values.update(overrides)
    return S3Target(settings(server.url, "bucket", **values))


def test_503_slowdown_then_success_is_retried(scripted, parquet_file):
    scripted.script.extend([(503, "SlowDown"), (503, "SlowDown")])
    receipt = scripted_target(scripted).upload(parquet_file, metadata())
    assert receipt.attempts == 3
    assert len(scripted.requests) == 3
    assert receipt.response_id == "0123456789abcdef"
    assert scripted.requests[0].startswith(f"/bucket/{KEY}")  # path-style for a non-AWS endpoint


def test_persistent_503_exhausts_the_budget(scripted, parquet_file):
    scripted.default = (503, "SlowDown")
    # Not 0.3 s: botocore's first request alone took that on a slow host (see the connection-refused test).
    fast = RetryPolicy(max_elapsed_s=2.0, initial_backoff_s=0.01, max_backoff_s=0.02)
    with pytest.raises(RetriesExhaustedError) as caught:
        scripted_target(scripted, retry=fast).upload(parquet_file, metadata())
    assert caught.value.status == 503
    assert caught.value.reason == "s3_SlowDown"
    assert caught.value.attempts == len(scripted.requests) >= 2


def test_botocore_request_attempts_are_not_counted_as_file_attempts(scripted, parquet_file):
    scripted.script.extend([(500, "InternalError")])  # botocore's second request attempt succeeds
    receipt = scripted_target(scripted, request_attempts=2).upload(parquet_file, metadata())
    assert receipt.attempts == 1
    assert len(scripted.requests) == 2


@pytest.mark.parametrize("status, code", [
    (503, "SlowDown"),
    (400, "RequestTimeout"),  # S3 sends this one as a 400
    (400, "Throttling"),
    (500, "InternalError"),
    (503, "ServiceUnavailable"),
    (502, "BadGateway"),
    (429, "TooManyRequests"),
])
def test_transient_codes_are_retryable(scripted, parquet_file, status, code):
    scripted.script.append((status, code))
    fast = RetryPolicy(max_elapsed_s=3.0, initial_backoff_s=0.01, max_backoff_s=0.02, max_attempts=1)
    with pytest.raises(RetryableUploadError) as caught:
        scripted_target(scripted, retry=fast).upload(parquet_file, metadata())
    assert caught.value.status == status
    assert code in str(caught.value)


@pytest.mark.parametrize("status, code, setting", [
    (403, "AccessDenied", CREDENTIALS_SETTING),
    (403, "InvalidAccessKeyId", CREDENTIALS_SETTING),
    (403, "SignatureDoesNotMatch", CREDENTIALS_SETTING),
    (403, "AllAccessDisabled", BUCKET_SETTING),
    (404, "NoSuchBucket", BUCKET_SETTING),
    (400, "AuthorizationHeaderMalformed", REGION_SETTING),
    (400, "EntityTooLarge", "SINK_FLUSH_BYTES"),
    (400, "ExpiredToken", CREDENTIALS_SETTING),  # S3 sends credential and region trouble as 400s too
    (400, "InvalidToken", CREDENTIALS_SETTING),
    (400, "InvalidArgument", "SINK_S3_ENDPOINT_URL"),
    (403, "RequestTimeTooSkewed", "the system clock (NTP)"),
])
def test_rejections_are_fatal_after_one_request(scripted, parquet_file, status, code, setting):
    scripted.script.append((status, code))
    with pytest.raises(FatalUploadError) as caught:
        scripted_target(scripted, request_attempts=3).upload(parquet_file, metadata())
    assert len(scripted.requests) == 1  # neither botocore nor we retried it
    assert caught.value.setting == setting
    assert caught.value.status == status
    assert code in str(caught.value) and setting in str(caught.value)
    assert "testing-secret-key" not in str(caught.value)


def test_credential_errors_say_where_credentials_come_from(scripted, parquet_file):
    scripted.script.append((403, "InvalidAccessKeyId"))
    with pytest.raises(FatalUploadError) as caught:
        scripted_target(scripted).upload(parquet_file, metadata())
    assert "AWS credentials (AWS_ACCESS_KEY_ID/profile/role)" in str(caught.value)


def test_read_timeout_is_retryable(scripted, parquet_file):
    scripted.delay_s = 2.0
    fast = RetryPolicy(max_elapsed_s=0.1, initial_backoff_s=0.01, max_backoff_s=0.02)
    with pytest.raises(RetriesExhaustedError) as caught:
        scripted_target(scripted, retry=fast, request_timeout_s=0.2).upload(parquet_file, metadata())
    assert caught.value.reason == "timeout"


# --- settings and wiring -------------------------------------------------------------------------------


def test_settings_are_hashable_picklable_and_validated():
    s = S3Settings(bucket="b", prefix="p", endpoint_url="http://127.0.0.1:9000", region="eu-west-1")
    assert hash(s) == hash(pickle.loads(pickle.dumps(s)))
    assert pickle.loads(pickle.dumps(s)) == s
    assert "S3Settings(bucket='b'" in repr(s)
    assert "http://***@host:9000" in repr(S3Settings(bucket="b", endpoint_url="http://u:pw123456@host:9000"))
    with pytest.raises(ValueError, match="SINK_S3_MULTIPART_PART_SIZE"):
        S3Settings(bucket="b", part_size=4 * MIB)
    with pytest.raises(ValueError, match="SINK_S3_BUCKET"):
        S3Settings(bucket="b/prefix")
    with pytest.raises(ValueError, match="SINK_S3_ENDPOINT_URL"):
        S3Settings(bucket="b", endpoint_url="minio:9000")


def test_metadata_values_are_header_safe():
    meta = object_metadata(metadata(primary_keys=("kundennr", "größe"), order_column=None))
    assert meta["primary-keys"] == "kundennr,gr%C3%B6%C3%9Fe"
    assert "order-column" not in meta
    assert all(v.isascii() for v in meta.values())


def test_describe_request_for_a_dry_run(moto_url, bucket, tmp_path):
    path = tmp_path / "f.parquet"
    path.write_bytes(b"x" * (12 * MIB))
    described = S3Target(settings(moto_url, bucket, part_size=5 * MIB)).describe_request(path, metadata())
    assert described["bucket"] == bucket
    assert described["key"] == KEY
    assert described["method"] == "multipart upload"
    assert described["parts"] == 3
    assert described["metadata"]["record-count"] == "3"
    assert "testing-secret-key" not in repr(described)


S3_ENV = {"SINK_TARGET": "s3", "SINK_KAFKA_BOOTSTRAP_SERVERS": "k:9092", "SINK_TOPICS": "orders"}


def test_config_builds_s3_settings_and_target(moto_url):
    config = load_config({
        **S3_ENV,
        "SINK_S3_BUCKET": "lake",
        "SINK_S3_PREFIX": "kafka/",
        "SINK_S3_ENDPOINT_URL": moto_url,
        "SINK_S3_REGION": "eu-central-1",
        "SINK_S3_MULTIPART_PART_SIZE": str(8 * MIB),
        "SINK_UPLOAD_RETRY_BUDGET_MS": "5000",
        "SINK_UPLOAD_TIMEOUT_MS": "7000",
    })
    s = target_settings(config)
    assert s == S3Settings(
        bucket="lake", prefix="kafka/", endpoint_url=moto_url, region="eu-central-1", part_size=8 * MIB,
        request_timeout_s=7.0, retry=RetryPolicy(max_elapsed_s=5.0),
    )
    target = build_target(s)
    assert isinstance(target, S3Target)
    target.close()


def test_config_requires_a_bucket_but_no_ems_settings():
    with pytest.raises(ConfigError) as caught:
        load_config(S3_ENV)
    assert caught.value.problems == ["SINK_S3_BUCKET is required when SINK_TARGET=s3."]


@pytest.mark.parametrize("overrides, mentions", [
    ({"SINK_S3_BUCKET": "lake/prefix"}, "SINK_S3_PREFIX"),
    ({"SINK_S3_MULTIPART_PART_SIZE": str(MIB)}, "SINK_S3_MULTIPART_PART_SIZE"),
    ({"SINK_S3_ENDPOINT_URL": "minio:9000"}, "SINK_S3_ENDPOINT_URL"),
    ({"SINK_S3_ENDPOINT_URL": "http://user:hunter22@minio:9000"}, "SINK_S3_ENDPOINT_URL"),
])
def test_config_rejects_bad_s3_settings(overrides, mentions):
    with pytest.raises(ConfigError) as caught:
        load_config({**S3_ENV, "SINK_S3_BUCKET": "lake", **overrides})
    assert len(caught.value.problems) == 1
    assert mentions in caught.value.problems[0]
    assert "hunter22" not in str(caught.value)
