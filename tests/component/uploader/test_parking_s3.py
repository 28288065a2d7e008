"""SINK_PARKED_PATH as an S3 URL: a rejected file and the endpoint's answer parked side by side in a
real S3 API (moto's server), and `python -m uploader push s3://...` re-pushing it from there."""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pyarrow.parquet as pq
import pytest

from sink_service.config import load_config
from sink_service.config.upload_targets import build_target, target_settings
from sink_service.decode import DecodeSpec
from sink_service.task.partition_task import TaskSpec, process_range
from sink_service.task.ranges import Range
from tests.support.config_helpers import config_problems, ems_env
from tests.unit.task.test_partition_task import reader, topic_log
from uploader import cli

pytestmark = pytest.mark.usefixtures("aws_env")  # dummy credentials, nothing from the machine

AUTH = "AppKey parking-s3-test-key"
REGION = "us-east-1"
PARKED_KEY = f"parked/t/0/{0:020d}-{99:020d}.parquet"


@pytest.fixture(scope="module")
def ems(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    from local_ems.server import LocalEmsServer

    server = LocalEmsServer(tmp_path_factory.mktemp("ems"), AUTH)
    server.start()
    yield server
    server.stop()


def environment(ems, moto_url: str, parked: str, **more: str) -> dict[str, str]:
    return {
        "SINK_KAFKA_BOOTSTRAP_SERVERS": "unused:9092", "SINK_TOPICS": "t", "SINK_PRIMARY_KEYS": "id",
        "SINK_EMS_ENDPOINT": ems.items_url(), "SINK_EMS_AUTHORIZATION": AUTH, "SINK_EMS_TARGET_TABLE": "{topic}",
        "SINK_REJECTED_FILE_POLICY": "park", "SINK_PARKED_PATH": parked, "SINK_S3_ENDPOINT_URL": moto_url,
        "SINK_S3_REGION": REGION, "SINK_UPLOAD_RETRY_BUDGET_MS": "1000", **more,
    }


def spec(tmp_path: Path, environ: dict[str, str]) -> TaskSpec:
    return TaskSpec(
        decode=DecodeSpec(None, ("id",), "_offset"),
        target_settings=target_settings(load_config(environ)),
        build_target=build_target,
        table_template="{topic}",
        scratch_dir=str(tmp_path / "scratch"),
        flush_bytes=1 << 30,
        flush_records=100,
        compression="snappy",
        error_policy="fail",
    )


def test_a_rejected_file_is_parked_in_s3_beside_the_answer_and_pushed_from_there(tmp_path, ems, moto_url):
    bucket = f"parked-{uuid.uuid4().hex[:12]}"
    s3 = boto3.client("s3", endpoint_url=moto_url, region_name=REGION)
    s3.create_bucket(Bucket=bucket)
    environ = environment(ems, moto_url, f"s3://{bucket}/parked/")
    ems.inject_fault(400, count=1)
    outcome = process_range(spec(tmp_path, environ), Range("t", 0, 0, 300), reader(topic_log(300, set())))
    outcome = outcome.to_pylist()[0]

    assert (outcome["status"], outcome["committable"], outcome["records_uploaded"]) == ("ok", 300, 200)
    [parked] = [f for f in json.loads(outcome["files"]) if f["parked"]]
    assert parked["location"] == f"s3://{bucket}/{PARKED_KEY}"
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"])
    assert keys == [PARKED_KEY, PARKED_KEY + ".response.json"]
    table = pq.read_table(io.BytesIO(s3.get_object(Bucket=bucket, Key=PARKED_KEY)["Body"].read()))
    assert table.column("id").to_pylist() == [str(i) for i in range(100)]
    answer = json.loads(s3.get_object(Bucket=bucket, Key=PARKED_KEY + ".response.json")["Body"].read())
    assert answer["status"] == 400 and answer["metadata"]["last_offset"] == 99

    out = tmp_path / "pushed"
    code = cli.main(["push", f"s3://{bucket}/{PARKED_KEY}", "--target", "dir"],
                    {**environ, "SINK_DIR_PATH": str(out)}, stdout=io.StringIO(), stderr=io.StringIO())
    assert code == 0
    [pushed] = out.rglob("*.parquet")
    assert pushed.relative_to(out).as_posix() == PARKED_KEY.removeprefix("parked/"), "named by the sidecar's metadata"
    assert pq.read_table(pushed).column("id").to_pylist() == [str(i) for i in range(100)]
    err = io.StringIO()
    missing = cli.main(["push", f"s3://{bucket}/parked/nothing.parquet", "--target", "dir"],
                       {**environ, "SINK_DIR_PATH": str(out)}, stdout=io.StringIO(), stderr=err)
    assert missing == cli.EXIT_USAGE and "no such object" in err.getvalue()


def test_parking_that_fails_is_retried_never_skipped(tmp_path, ems, moto_url):
    environ = environment(ems, moto_url, f"s3://missing-{uuid.uuid4().hex[:12]}/parked")
    ems.inject_fault(400, count=1)
    outcome = process_range(spec(tmp_path, environ), Range("t", 0, 0, 300), reader(topic_log(300, set())))
    outcome = outcome.to_pylist()[0]
    assert (outcome["status"], outcome["committable"]) == ("retryable", 0)
    assert "parking" in outcome["error"] and "SINK_PARKED_PATH" in outcome["error"]


def test_parked_path_urls_are_checked():
    park = {"SINK_REJECTED_FILE_POLICY": "park"}
    assert load_config(ems_env(**park, SINK_PARKED_PATH="s3://bucket/prefix")).parked_path == "s3://bucket/prefix"
    assert "names no bucket" in config_problems(ems_env(**park, SINK_PARKED_PATH="s3:///prefix"))[0]
    assert "directory or an `s3://" in config_problems(ems_env(**park, SINK_PARKED_PATH="gs://bucket"))[0]
    plain_http = config_problems(ems_env(**park, SINK_PARKED_PATH="s3://b", SINK_S3_ENDPOINT_URL="http://minio:9000"))
    assert "SINK_S3_ALLOW_HTTP" in plain_http[0]


# --- an S3 target whose rejections are about credentials or the region, never about the file -------------


@pytest.fixture
def scripted_s3():
    from tests.component.uploader.test_uploader_s3 import ScriptedS3

    server = ScriptedS3()
    yield server
    server.stop()


def s3_target_environment(url: str, parked: Path) -> dict[str, str]:
    return {
        "SINK_KAFKA_BOOTSTRAP_SERVERS": "unused:9092", "SINK_TOPICS": "t", "SINK_PRIMARY_KEYS": "id",
        "SINK_TARGET": "s3", "SINK_S3_BUCKET": "lake", "SINK_S3_ENDPOINT_URL": url, "SINK_S3_ALLOW_HTTP": "true",
        "SINK_S3_REGION": REGION, "SINK_UPLOAD_RETRY_BUDGET_MS": "1000",
        "SINK_REJECTED_FILE_POLICY": "park", "SINK_PARKED_PATH": str(parked),
    }


@pytest.mark.parametrize(("status", "code", "setting"), [
    (400, "ExpiredToken", "AWS credentials"),  # expiring web-identity credentials
    (400, "InvalidToken", "AWS credentials"),
    (400, "AuthorizationHeaderMalformed", "SINK_S3_REGION"),  # signed for the wrong region
    (400, "InvalidArgument", "SINK_S3_ENDPOINT_URL"),
    (400, "InvalidRequest", "SINK_S3_ENDPOINT_URL"),
    (400, None, "SINK_S3_BUCKET"),  # a 400 without an S3 error code says nothing about the file either
    (403, "RequestTimeTooSkewed", "clock"),
])
def test_an_s3_credential_or_region_rejection_is_fatal_and_never_parked(tmp_path, scripted_s3, status, code, setting):
    """S3 answers 400 to credential and region problems: parking on the status alone would set aside
    every file while the credentials are expired, and commit their offsets."""
    scripted_s3.default = (status, code)  # every request: the credentials stay expired
    parked = tmp_path / "parked"
    environ = s3_target_environment(scripted_s3.url, parked)
    outcome = process_range(spec(tmp_path, environ), Range("t", 0, 0, 300), reader(topic_log(300, set())))
    outcome = outcome.to_pylist()[0]

    assert (outcome["status"], outcome["committable"]) == ("fatal", 0), outcome["error"]
    assert not parked.exists() or not any(parked.rglob("*")), "nothing parked"
    assert setting in outcome["error"]
    assert len(scripted_s3.requests) == 1, "not retried: the first file's rejection stops the range"


def test_an_s3_refusal_of_the_file_itself_is_parked(tmp_path, scripted_s3):
    """EntityTooLarge is about this file (its size), like EMS's 413: parked, and the range goes on."""
    scripted_s3.script.append((400, "EntityTooLarge"))
    parked = tmp_path / "parked"
    environ = s3_target_environment(scripted_s3.url, parked)
    outcome = process_range(spec(tmp_path, environ), Range("t", 0, 0, 300), reader(topic_log(300, set())))
    outcome = outcome.to_pylist()[0]

    assert (outcome["status"], outcome["committable"], outcome["records_uploaded"]) == ("ok", 300, 200)
    file = parked / "t" / "0" / f"{0:020d}-{99:020d}.parquet"
    answer = json.loads(file.with_name(file.name + ".response.json").read_text())
    assert (answer["status"], answer["reason"]) == (400, "s3_EntityTooLarge")
