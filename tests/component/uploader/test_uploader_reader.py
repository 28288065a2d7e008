"""Reading back a dir or S3 target: every file, temp files skipped, latest row per primary key."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from moto.server import ThreadedMotoServer

from uploader.directory import DirectorySettings, DirectoryTarget
from uploader.reader import latest_per_key, latest_rows, parquet_files, read_all, resolve
from uploader.retry import RetryPolicy
from uploader.s3 import S3Target
from uploader.s3_settings import S3Settings
from uploader.target import FileMetadata

FAST = RetryPolicy(max_elapsed_s=2.0, initial_backoff_s=0.01, max_backoff_s=0.02)


def meta(topic: str, partition: int, first: int, last: int) -> FileMetadata:
    return FileMetadata(topic, partition, first, last, last - first + 1, topic, ("id",), "_offset", "f")


def write(path: Path, **columns) -> Path:
    pq.write_table(pa.table(columns), path)
    return path


def push_history(target, tmp_path: Path) -> None:
    """Two partitions; key "a" is updated in a later file, "b" twice in one file."""
    files = [
        (meta("orders", 0, 0, 2), dict(id=["a", "b", "b"], v=[1, 2, 3], _offset=[0, 1, 2])),
        (meta("orders", 0, 3, 4), dict(id=["a", "c"], v=[4, 5], _offset=[3, 4])),
        (meta("orders", 1, 0, 0), dict(id=["d"], v=[6], _offset=[0])),
    ]
    for i, (m, columns) in enumerate(files):
        target.upload(write(tmp_path / f"scratch-{i}.parquet", **columns), m)


EXPECTED = [
    {"id": "a", "v": 4, "_offset": 3},
    {"id": "b", "v": 3, "_offset": 2},
    {"id": "c", "v": 5, "_offset": 4},
    {"id": "d", "v": 6, "_offset": 0},
]


# --- the reduction itself ----------------------------------------------------------------------------


def test_highest_order_value_wins_per_key():
    table = pa.table({"id": [1, 2, 1, 2, 3], "v": ["x", "y", "z", "w", "q"], "o": [5, 1, 7, 0, None]})
    assert latest_per_key(table, ["id"], "o").to_pylist() == [
        {"id": 1, "v": "z", "o": 7},
        {"id": 2, "v": "y", "o": 1},
        {"id": 3, "v": "q", "o": None},
    ]


def test_null_order_loses_and_ties_go_to_the_later_row():
    table = pa.table({"id": ["k", "k", "k", "j", "j"], "v": [1, 2, 3, 4, 5], "o": [1, None, 1, 2, 2]})
    assert latest_per_key(table, ["id"], "o").column("v").to_pylist() == [5, 3]


def test_composite_keys_with_nulls():
    table = pa.table({"a": [1, 1, 1, None, None], "b": ["x", "y", "x", "x", "x"], "o": [1, 2, 3, 4, 5]})
    rows = latest_per_key(table, ["a", "b"], "o").to_pylist()
    assert rows == [
        {"a": 1, "b": "x", "o": 3},
        {"a": 1, "b": "y", "o": 2},
        {"a": None, "b": "x", "o": 5},
    ]


def test_without_keys_every_row_is_kept_and_without_order_the_last_row_wins():
    table = pa.table({"id": [1, 1], "o": [2, 1]})
    assert latest_per_key(table, [], "o") == table
    assert latest_per_key(table, ["id"], None).to_pylist() == [{"id": 1, "o": 1}]


def test_missing_columns_are_named():
    with pytest.raises(ValueError, match="tenant"):
        latest_per_key(pa.table({"id": [1], "_offset": [1]}), ["id", "tenant"], "_offset")


def test_large_table_is_reduced_quickly():
    n = 300_000
    table = pa.table({"id": pa.array(range(n)).to_numpy() % 1000, "_offset": range(n)})
    started = time.monotonic()
    latest = latest_per_key(table, ["id"], "_offset")
    assert time.monotonic() - started < 2.0  # vectorised; a per-row Python loop would be far slower
    assert latest.num_rows == 1000
    assert latest.column("_offset").to_pylist()[:2] == [n - 1000, n - 999]


# --- directory -----------------------------------------------------------------------------------------


def test_directory_latest_rows_skip_temp_and_hidden_files(tmp_path):
    out = tmp_path / "out"
    push_history(DirectoryTarget(DirectorySettings(str(out), retry=FAST)), tmp_path)
    partition = out / "orders" / "0"
    write(partition / ".00000000000000000005-00000000000000000005.parquet.tmp-0123abcd", id=["a"], v=[99], _offset=[9])
    write(partition / ".hidden.parquet", id=["a"], v=[98], _offset=[8])
    (partition / "notes.txt").write_text("not parquet")
    assert [Path(p).relative_to(out).as_posix() for p in parquet_files(out)] == [
        "orders/0/00000000000000000000-00000000000000000002.parquet",
        "orders/0/00000000000000000003-00000000000000000004.parquet",
        "orders/1/00000000000000000000-00000000000000000000.parquet",
    ]
    assert latest_rows(out, ["id"], "_offset").to_pylist() == EXPECTED
    assert latest_rows(DirectorySettings(str(out)), ["id"], "_offset").to_pylist() == EXPECTED
    assert read_all(out).num_rows == 6


def test_differing_schemas_are_unified(tmp_path):
    out = tmp_path / "out"
    target = DirectoryTarget(DirectorySettings(str(out), retry=FAST))
    first = write(tmp_path / "a.parquet", id=pa.array(["a"]), v=pa.array([1], pa.int32()), _offset=[0])
    target.upload(first, meta("t", 0, 0, 0))
    second = write(tmp_path / "b.parquet", id=["a", "b"], v=pa.array([2, 3], pa.int64()), note=["x", "y"],
                   _offset=[1, 2])
    target.upload(second, meta("t", 0, 1, 2))
    latest = latest_rows(out, ["id"], "_offset")
    assert latest.schema.field("v").type == pa.int64()
    assert latest.to_pylist() == [
        {"id": "a", "v": 2, "_offset": 1, "note": "x"},
        {"id": "b", "v": 3, "_offset": 2, "note": "y"},
    ]


def test_empty_and_missing_directories(tmp_path):
    assert read_all(tmp_path).num_rows == 0
    with pytest.raises(FileNotFoundError):
        read_all(tmp_path / "missing")


def test_locations_are_resolved():
    assert resolve("s3://lake/raw/kafka/") == S3Settings(bucket="lake", prefix="raw/kafka")
    assert resolve("/data/out") == DirectorySettings("/data/out")
    assert resolve(Path("/data/out")) == DirectorySettings("/data/out")


# --- S3 (moto's real HTTP server) --------------------------------------------------------------------


@pytest.fixture
def moto_s3(monkeypatch, tmp_path):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing-key-id")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing-secret-key")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def test_s3_latest_rows(moto_s3, tmp_path):
    client = boto3.client("s3", endpoint_url=moto_s3, region_name="us-east-1")
    bucket = f"lake-{uuid.uuid4().hex[:12]}"  # moto keeps one store per process: no sharing across tests
    client.create_bucket(Bucket=bucket)
    settings = S3Settings(bucket=bucket, prefix="raw", endpoint_url=moto_s3, region="us-east-1", retry=FAST)
    with S3Target(settings) as target:
        push_history(target, tmp_path)
    # Neither an object outside the prefix nor a hidden one is read.
    client.put_object(Bucket=bucket, Key="other/orders/0/x.parquet", Body=b"not parquet")
    client.put_object(Bucket=bucket, Key="raw/orders/0/.partial.parquet", Body=b"not parquet")
    assert parquet_files(settings) == [
        f"s3://{bucket}/raw/orders/0/00000000000000000000-00000000000000000002.parquet",
        f"s3://{bucket}/raw/orders/0/00000000000000000003-00000000000000000004.parquet",
        f"s3://{bucket}/raw/orders/1/00000000000000000000-00000000000000000000.parquet",
    ]
    assert latest_rows(settings, ["id"], "_offset").to_pylist() == EXPECTED
