"""`python -m uploader push` reads topic, partition and offsets from the dir/S3 targets' names too.

The `dir` and `s3` targets name files `<topic>/<partition>/<first:020d>-<last:020d>.parquet`: the path
holds everything the push needs, so re-pushing one (say from a dir target into EMS, or a file copied
out of a bucket) must not need four flags. Flags still win.
"""

from __future__ import annotations

import io
import json
import uuid
from pathlib import Path

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from uploader import cli

TARGET_NAME = "orders_eu.v2/7/00000000000000000100-00000000000000000102.parquet"


def _write(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": ["a", "b", "a"], "_offset": pa.array([100, 101, 102], pa.int64())}), path)
    return path


def _dry_run(*args: str, env: dict[str, str]) -> tuple[int, dict, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(["push", "--dry-run", *args], environ=env, stdout=out, stderr=err)
    return code, json.loads(out.getvalue()) if code == 0 else {}, err.getvalue()


def _range(metadata: dict) -> tuple:
    return metadata["topic"], metadata["partition"], metadata["first_offset"], metadata["last_offset"]


def test_a_dir_target_file_is_pushed_without_flags(tmp_path):
    source = _write(tmp_path / "lake" / TARGET_NAME)
    env = {"SINK_TARGET": "dir", "SINK_DIR_PATH": str(tmp_path / "copy")}
    code, described, err = _dry_run(str(source), env=env)
    assert code == 0, err
    assert _range(described["metadata"]) == ("orders_eu.v2", 7, 100, 102)
    assert described["metadata"]["record_count"] == 3
    assert described["request"]["final_path"] == str(tmp_path / "copy" / TARGET_NAME)


def test_flags_still_win_over_a_target_name(tmp_path):
    source = _write(tmp_path / "lake" / TARGET_NAME)
    env = {"SINK_TARGET": "dir", "SINK_DIR_PATH": str(tmp_path / "copy")}
    code, described, err = _dry_run(str(source), "--topic", "replayed", "--first-offset", "90", env=env)
    assert code == 0, err
    assert _range(described["metadata"]) == ("replayed", 7, 90, 102)


@pytest.mark.parametrize("name", [
    "orders/x/00000000000000000100-00000000000000000102.parquet",  # partition not a number
    "orders/7/100.parquet",  # no range
    "00000000000000000100-00000000000000000102.parquet",  # no topic/partition folders
])
def test_other_shapes_still_ask_for_the_flags(tmp_path, name):
    source = _write(tmp_path / "lake" / name)
    code, _, err = _dry_run(str(source), env={"SINK_TARGET": "dir", "SINK_DIR_PATH": str(tmp_path / "copy")})
    assert code == 2
    assert "--topic" in err
    assert "<topic>/<partition>/<first>-<last>.parquet" in err


def test_an_object_of_an_s3_target_is_pushed_by_its_url_without_flags(tmp_path, moto_url, aws_env):
    bucket = f"lake-{uuid.uuid4().hex[:12]}"
    client = boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1")
    client.create_bucket(Bucket=bucket)
    local = _write(tmp_path / "f.parquet")
    client.upload_file(str(local), bucket, f"raw/{TARGET_NAME}")
    env = {"SINK_TARGET": "dir", "SINK_DIR_PATH": str(tmp_path / "copy"), "SINK_S3_ENDPOINT_URL": moto_url,
           "SINK_S3_REGION": "us-east-1"}
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(["push", f"s3://{bucket}/raw/{TARGET_NAME}"], environ=env, stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    pushed = tmp_path / "copy" / TARGET_NAME
    assert pq.read_table(pushed).num_rows == 3
