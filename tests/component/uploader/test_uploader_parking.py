"""Parking files the endpoint rejects as bad content (SINK_REJECTED_FILE_POLICY=park).

Against the real local EMS endpoint with an injected 400/401, through a real partition task.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sink_service.config import ConfigError, load_config
from sink_service.config.upload_targets import build_target, target_settings
from sink_service.decode import DecodeSpec
from sink_service.driver.metrics import SinkMetrics
from sink_service.task.partition_task import TaskSpec, process_range
from sink_service.task.ranges import Range
from tests.unit.task.test_partition_task import reader, topic_log
from uploader.directory import DirectorySettings
from uploader.ems import EmsSettings
from uploader.errors import FatalUploadError
from uploader.parking import ParkingSettings, read_sidecar_metadata
from uploader.retry import RetryPolicy
from uploader.target import FileMetadata

AUTH = "AppKey parking-test-key"


@pytest.fixture(scope="module")
def ems(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    from local_ems.server import LocalEmsServer

    server = LocalEmsServer(tmp_path_factory.mktemp("ems"), AUTH)
    server.start()
    yield server
    server.stop()


def spec(tmp_path: Path, ems, parked: Path | str) -> TaskSpec:
    retry = RetryPolicy(max_elapsed_s=1)
    return TaskSpec(
        decode=DecodeSpec(None, ("id",), "_offset"),
        target_settings=ParkingSettings(
            inner=EmsSettings(endpoint=ems.items_url(), authorization=AUTH, retry=retry),
            parked=DirectorySettings(path=str(parked), retry=retry)),
        build_target=build_target,
        table_template="{topic}",
        scratch_dir=str(tmp_path / "scratch"),
        flush_bytes=1 << 30,
        flush_records=100,
        compression="snappy",
        error_policy="fail",
    )


def test_a_400_parks_the_file_with_the_response_and_the_range_continues(tmp_path, ems):
    ems.inject_fault(400, count=1)
    parked = tmp_path / "parked"
    batch = process_range(spec(tmp_path, ems, parked), Range("t", 0, 0, 300), reader(topic_log(300, set())))
    outcome = batch.to_pylist()[0]

    assert outcome["status"] == "ok", outcome["error"]
    assert outcome["committable"] == 300
    assert outcome["records_uploaded"] == 200  # the parked file's rows are not counted as uploaded
    file = parked / "t" / "0" / f"{0:020d}-{99:020d}.parquet"
    assert pq.read_table(file).column("id").to_pylist() == [str(i) for i in range(100)]
    response = json.loads(file.with_name(file.name + ".response.json").read_text())
    assert response["status"] == 400 and response["reason"] == "http_400"
    assert response["metadata"]["first_offset"] == 0 and response["metadata"]["last_offset"] == 99
    assert read_sidecar_metadata(file) == FileMetadata(**{**response["metadata"], "primary_keys": ("id",)})
    assert not list(parked.rglob(".*"))  # no temporary file left behind

    metrics = SinkMetrics()
    metrics.record_outcome(SimpleNamespace(**outcome), "ems", {})
    assert metrics.registry.get_sample_value(
        "sink_parked_files_total", {"topic": "t", "reason": "http_400"}) == 1
    assert metrics.registry.get_sample_value("sink_files_uploaded_total", {"topic": "t", "partition": "0"}) == 2


@pytest.mark.parametrize("status", [401, 403, 404])
def test_a_credential_or_endpoint_rejection_is_still_fatal_and_nothing_is_parked(tmp_path, ems, status):
    ems.inject_fault(status, count=1)
    parked = tmp_path / "parked"
    outcome = process_range(
        spec(tmp_path, ems, parked), Range("t", 0, 0, 100), reader(topic_log(100, set()))).to_pylist()[0]
    assert outcome["status"] == "fatal"
    assert outcome["committable"] == 0
    assert not parked.exists()


def test_a_parked_location_that_cannot_be_written_is_retryable(tmp_path, ems):
    ems.inject_fault(400, count=1)
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("x")
    outcome = process_range(
        spec(tmp_path, ems, blocker), Range("t", 0, 0, 100), reader(topic_log(100, set()))).to_pylist()[0]
    assert outcome["status"] == "retryable"
    assert outcome["committable"] == 0
    assert "SINK_PARKED_PATH" in outcome["error"]


def test_the_endpoint_status_is_an_attribute_of_the_rejection(tmp_path, ems):
    ems.inject_fault(413, count=1)
    target = build_target(EmsSettings(endpoint=ems.items_url(), authorization=AUTH,
                                      retry=RetryPolicy(max_elapsed_s=1)))
    path = tmp_path / "f.parquet"
    pq.write_table(pa.table({"id": ["a"]}), path)
    metadata = FileMetadata("t", 0, 0, 0, 1, "t", ("id",), None, "x")
    with pytest.raises(FatalUploadError) as raised:
        target.upload(path, metadata)
    assert raised.value.status == 413
    assert raised.value.body


BASE = {"SINK_KAFKA_BOOTSTRAP_SERVERS": "b:9092", "SINK_TOPICS": "t", "SINK_GROUP_ID": "g",
        "SINK_TARGET": "dir", "SINK_DIR_PATH": "/tmp/out"}


@pytest.mark.parametrize(("path", "problem"), [
    (None, "SINK_PARKED_PATH is required when SINK_REJECTED_FILE_POLICY=park"),
    ("gs://bucket/prefix", "SINK_PARKED_PATH must be a directory or an `s3://<bucket>/<prefix>` URL, not gs://"),
])
def test_park_needs_a_directory(path, problem):
    env = {**BASE, "SINK_REJECTED_FILE_POLICY": "park", **({"SINK_PARKED_PATH": path} if path else {})}
    with pytest.raises(ConfigError) as raised:
        load_config(env)
    assert problem in str(raised.value)


def test_by_default_a_rejection_is_not_parked():
    assert not isinstance(target_settings(load_config(BASE)), ParkingSettings)
    parked = target_settings(load_config({**BASE, "SINK_REJECTED_FILE_POLICY": "park", "SINK_PARKED_PATH": "/p"}))
    assert isinstance(parked, ParkingSettings) and parked.parked.path == "/p"


def test_the_sidecar_rename_is_made_durable_by_fsyncing_its_directory(tmp_path, ems, monkeypatch):
    """Without the directory's fsync a power loss after the offsets' commit can lose the sidecar's name."""
    import os

    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src, dst) -> None:
        real_replace(src, dst)
        events.append(("rename", str(dst)))

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    ems.inject_fault(400, count=1)
    parked = tmp_path / "parked"
    retry = RetryPolicy(max_elapsed_s=1)
    target = build_target(ParkingSettings(
        inner=EmsSettings(endpoint=ems.items_url(), authorization=AUTH, retry=retry),
        parked=DirectorySettings(path=str(parked), retry=retry)))
    path = tmp_path / "f.parquet"
    pq.write_table(pa.table({"id": ["a"]}), path)
    receipt = target.upload(path, FileMetadata("t", 0, 0, 0, 1, "t", ("id",), None, "x"))
    target.close()

    sidecar = receipt.location + ".response.json"
    assert ("rename", sidecar) in events
    after = events[events.index(("rename", sidecar)) + 1:]
    assert ("fsync", str(Path(sidecar).parent)) in after, events
