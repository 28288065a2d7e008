"""The same service landing files in an S3-compatible store (moto's real server) and a directory."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

import boto3
import pytest
from moto.server import ThreadedMotoServer

from devkit.brokers import free_port
from devkit.kafka_data import Workload, committed_offsets, create_topics, end_offsets, produce_orders
from devkit.service_process import wait_until
from tests.e2e.checks import all_committed
from uploader.directory import DirectorySettings
from uploader.reader import latest_rows
from uploader.s3_settings import S3Settings

pytestmark = pytest.mark.e2e

AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing-secret", "AWS_DEFAULT_REGION": "us-east-1"}
_KEY = re.compile(r"(?P<topic>[^/]+)/(?P<p>\d+)/(?P<f>\d{20})-(?P<l>\d{20})\.parquet")


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


def _latest_matches(source, topic: str, workload: Workload) -> bool:
    try:
        table = latest_rows(source, ("id",), "_offset")
    except Exception:
        return False
    expected = workload.expected_rows(topic)
    got = {row["id"]: row["version"] for row in table.select(["id", "version"]).to_pylist()}
    return got == {key: value["version"] for key, value in expected.items()}


def _assert_ranges(keys: list[str], topic: str, ends: dict[int, int]) -> None:
    """One object per offset range, ranges contiguous from 0 to the end offset, none overlapping."""
    spans: dict[int, list[tuple[int, int]]] = {}
    for key in keys:
        match = _KEY.search(key)
        assert match and match["topic"] == topic, key
        spans.setdefault(int(match["p"]), []).append((int(match["f"]), int(match["l"])))
    for partition, end in ends.items():
        covered = 0
        for first, last in sorted(spans[partition]):
            assert first == covered, f"partition {partition}: object starts at {first}, expected {covered}"
            covered = last + 1
        assert covered == end


def test_s3_target_with_kill_minus_nine(bootstrap, s3_endpoint, unique, service_env, services):
    topic, group, bucket = unique("s3orders"), unique("group"), unique("bucket")
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing-secret")
    client.create_bucket(Bucket=bucket)
    create_topics(bootstrap, {topic: 3})
    workload = Workload()
    produce_orders(bootstrap, topic, keys=4000, updates=5, workload=workload)
    env = service_env(topic, group, SINK_TARGET="s3", SINK_S3_BUCKET=bucket, SINK_S3_PREFIX="landing",
                      SINK_S3_ENDPOINT_URL=s3_endpoint, SINK_S3_REGION="us-east-1", SINK_FLUSH_RECORDS=1000,
                      SINK_MAX_FILES_PER_BATCH=3, SINK_MAX_BATCH_RECORDS=3000, **AWS_ENV)
    env.pop("SINK_EMS_ENDPOINT")
    env.pop("SINK_EMS_AUTHORIZATION")

    def committed() -> int:
        return sum(committed_offsets(bootstrap, group, topic, 3).values())

    service = services(env)
    wait_until(lambda: committed() > 0, 120, "progress before the crash", process=service)
    service.kill9()
    assert committed() < workload.produced

    service = services(env)
    source = S3Settings(bucket=bucket, prefix="landing", endpoint_url=s3_endpoint, region="us-east-1")
    os.environ.update(AWS_ENV)  # the reader uses boto3's standard credential chain, like the service
    wait_until(lambda: all_committed(bootstrap, group, topic, 3), 180, "all commits", process=service)
    assert service.terminate() == 0
    assert _latest_matches(source, topic, workload)
    keys = [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
            for o in page.get("Contents", [])]
    assert all(k.startswith(f"landing/{topic}/") for k in keys)
    _assert_ranges(keys, topic, end_offsets(bootstrap, topic, 3))
    head = client.head_object(Bucket=bucket, Key=keys[0])
    assert head["Metadata"], "object metadata is missing"


def test_dir_target_end_to_end(bootstrap, tmp_path, unique, service_env, services):
    topic, group = unique("dirorders"), unique("group")
    create_topics(bootstrap, {topic: 3})
    workload = Workload()
    produce_orders(bootstrap, topic, keys=3000, updates=3, workload=workload)
    out = tmp_path / "landing"
    env = service_env(topic, group, SINK_TARGET="dir", SINK_DIR_PATH=str(out), SINK_FLUSH_RECORDS=1000)
    env.pop("SINK_EMS_ENDPOINT")
    env.pop("SINK_EMS_AUTHORIZATION")
    service = services(env)
    wait_until(lambda: all_committed(bootstrap, group, topic, 3), 180, "all commits", process=service)
    assert service.terminate() == 0
    assert _latest_matches(DirectorySettings(str(out)), topic, workload)
    files = [str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()]
    assert not [f for f in files if ".tmp-" in f], "a temporary file is left behind"
    _assert_ranges(files, topic, end_offsets(bootstrap, topic, 3))
