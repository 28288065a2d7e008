"""`python -m uploader`: push and read, exit codes 0/2/3/4, dry runs that mask credentials.

A few tests run the real `python -m uploader` in a subprocess (the entry point, the environment
only configuration); the rest call cli.main() in-process with an explicit environment, which is
the same code and much faster.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from moto.server import ThreadedMotoServer

from local_ems import LocalEmsServer
from sink_service.task.parquet_files import schema_fingerprint as service_fingerprint
from uploader import cli
from uploader.parquet_info import footer_info, parse_file_name, schema_fingerprint

ROOT = Path(__file__).resolve().parents[3]
SECRET = "cli-secret-app-key-0123456789"
AUTH = f"AppKey {SECRET}"
PROXY_PASSWORD = "proxy-pass-987654"
FILE_NAME = "topic-orders_eu_partition-2_firstOffset-100_lastOffset-102.parquet"
REL = "orders_eu/2/00000000000000000100-00000000000000000102.parquet"


@pytest.fixture
def parquet_file(tmp_path) -> Path:
    path = tmp_path / "scratch" / FILE_NAME
    path.parent.mkdir()
    table = pa.table({
        "id": ["a", "b", "a"],
        "amount": [1.5, 2.0, 3.25],
        "_offset": pa.array([100, 101, 102], pa.int64()),
        "_timestamp": pa.array([1, 2, 3], pa.timestamp("ms", tz="UTC")),
    })
    pq.write_table(table, path)
    return path


@pytest.fixture
def ems(tmp_path):
    server = LocalEmsServer(tmp_path / "ems", AUTH).start()
    yield server
    server.stop()


def ems_env(server: LocalEmsServer, **extra: str) -> dict[str, str]:
    return {
        "SINK_EMS_ENDPOINT": server.items_url(),
        "SINK_EMS_AUTHORIZATION": AUTH,
        "SINK_EMS_TARGET_TABLE": "{topic}",
        "SINK_PRIMARY_KEYS": "id",
        "SINK_UPLOAD_RETRY_BUDGET_MS": "2000",
        **extra,
    }


def run_module(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """The real entry point, with only the given SINK_* variables (no Kafka settings at all)."""
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT), "HOME": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "uploader", *args],
        cwd=ROOT, env={**base, **env}, capture_output=True, text=True, timeout=60,
    )


def run_main(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(args), environ=env, stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def assert_no_secret(*texts: str) -> None:
    for text in texts:
        assert SECRET not in text
        assert PROXY_PASSWORD not in text


# --- the real entry point ----------------------------------------------------------------------------


def test_push_then_read_a_directory_target(tmp_path, parquet_file):
    env = {"SINK_TARGET": "dir", "SINK_DIR_PATH": str(tmp_path / "out")}
    pushed = run_module("push", str(parquet_file), env=env)
    assert pushed.returncode == 0, pushed.stderr
    receipt = json.loads(pushed.stdout)
    assert receipt["target"] == "dir"
    assert receipt["location"] == str(tmp_path / "out" / REL)
    assert (tmp_path / "out" / REL).read_bytes() == parquet_file.read_bytes()

    read = run_module("read", "--target", "dir", "--primary-keys", "id", "--order-column", "_offset", env=env)
    assert read.returncode == 0, read.stderr
    rows = [json.loads(line) for line in read.stdout.splitlines()]
    assert [(r["id"], r["amount"], r["_offset"]) for r in rows] == [("a", 3.25, 102), ("b", 2.0, 101)]
    assert rows[0]["_timestamp"].startswith("1970-01-01T00:00:00.003")


def test_push_to_ems_applies_the_upsert(ems, parquet_file):
    result = run_module("push", str(parquet_file), "--target", "ems", env=ems_env(ems))
    assert result.returncode == 0, result.stderr
    receipt = json.loads(result.stdout)
    assert receipt["target"] == "ems" and receipt["attempts"] == 1
    rows = sorted(ems.table("orders_eu"), key=lambda r: r["id"])
    assert [(r["id"], r["amount"]) for r in rows] == [("a", 3.25), ("b", 2.0)]
    assert_no_secret(result.stdout, result.stderr)


def test_rejected_credential_exits_3(ems, parquet_file):
    env = ems_env(ems, SINK_EMS_AUTHORIZATION="AppKey wrong-key-" + SECRET[::-1])
    result = run_module("push", str(parquet_file), env=env)
    assert result.returncode == 3, result.stderr
    assert "SINK_EMS_AUTHORIZATION" in result.stderr
    assert "401" in result.stderr
    assert SECRET[::-1] not in result.stderr + result.stdout
    assert ems.stats()["total_requests"] == 1  # not retried: retrying a bad credential can lock an account
    assert ems.uploads() == []


def test_endpoint_down_exits_4_after_the_retry_budget(ems, parquet_file):
    ems.inject_fault(status=503)
    result = run_module("push", str(parquet_file), env=ems_env(ems, SINK_UPLOAD_RETRY_BUDGET_MS="400"))
    assert result.returncode == 4, result.stderr
    assert "503" in result.stderr and "gave up after" in result.stderr
    assert ems.table("orders_eu") == []
    assert_no_secret(result.stdout, result.stderr)


def test_dry_run_prints_the_request_with_the_credential_masked(ems, parquet_file):
    env = ems_env(ems, SINK_EMS_PROXY_URL="http://proxy.local:3128", SINK_EMS_PROXY_USERNAME="svc",
                  SINK_EMS_PROXY_PASSWORD=PROXY_PASSWORD)
    result = run_module("push", "--dry-run", str(parquet_file), env=env)
    assert result.returncode == 0, result.stderr
    described = json.loads(result.stdout)
    request = described["request"]
    assert request["method"] == "POST"
    assert request["url"].startswith(ems.items_url() + "?targetName=orders_eu&")
    assert "primaryKeys=id&duplicateRemovalOrderColumn=_offset" in request["url"]
    assert request["headers"]["Authorization"] == "AppKey ***"
    assert request["file_name"] == FILE_NAME
    assert request["file_size"] == parquet_file.stat().st_size
    assert request["proxy"] == "http://***@proxy.local:3128"
    assert described["metadata"]["record_count"] == 3
    assert_no_secret(result.stdout, result.stderr)
    assert ems.uploads() == []  # nothing was sent


def test_configuration_errors_exit_2_without_kafka_settings(parquet_file):
    result = run_module("push", str(parquet_file), env={"SINK_EMS_AUTHORIZATION": AUTH})
    assert result.returncode == 2
    assert "SINK_EMS_ENDPOINT" in result.stderr
    assert "KAFKA" not in result.stderr
    assert_no_secret(result.stderr)


def test_a_misspelt_setting_exits_2_naming_the_closest_one(tmp_path, parquet_file):
    env = {"SINK_TARGET": "dir", "SINK_DIR_PATH": str(tmp_path / "out"), "SINK_PRIMARY_KEY": "id"}
    code, _, err = run_main("push", str(parquet_file), env=env)
    assert code == 2
    assert "SINK_PRIMARY_KEY is not a setting" in err and "SINK_PRIMARY_KEYS" in err
    assert not (tmp_path / "out").exists()


# --- in-process: arguments, metadata, S3 -------------------------------------------------------------


def test_file_names_are_parsed_with_underscores_in_the_topic():
    parsed = parse_file_name(f"/some/dir/{FILE_NAME}")
    assert (parsed.topic, parsed.partition, parsed.first_offset, parsed.last_offset) == ("orders_eu", 2, 100, 102)
    assert parse_file_name("part-0000.parquet") is None


def test_fingerprint_matches_the_service(parquet_file):
    info = footer_info(parquet_file)
    assert info.record_count == 3
    assert info.schema_fingerprint == service_fingerprint(pq.read_table(parquet_file).schema)
    assert info.schema_fingerprint == schema_fingerprint(info.schema)


def test_flags_override_the_file_name_and_are_required_without_one(tmp_path, parquet_file):
    other = tmp_path / "export.parquet"
    other.write_bytes(parquet_file.read_bytes())
    env = {"SINK_TARGET": "dir", "SINK_DIR_PATH": str(tmp_path / "out")}
    code, _, err = run_main("push", str(other), env=env)
    assert code == 2
    assert "--topic, --partition, --first-offset, --last-offset" in err
    code, out, err = run_main("push", str(other), "--topic", "t", "--partition", "0", "--first-offset", "7",
                              "--last-offset", "9", "--dry-run", env=env)
    assert code == 0, err
    final = tmp_path / "out" / "t" / "0" / "00000000000000000007-00000000000000000009.parquet"
    assert json.loads(out)["request"]["final_path"] == str(final)
    code, out, err = run_main("push", str(parquet_file), "--partition", "5", "--dry-run", env=env)
    assert code == 0, err
    assert json.loads(out)["metadata"]["partition"] == 5
    assert json.loads(out)["metadata"]["topic"] == "orders_eu"


@pytest.mark.parametrize("args, mentions", [
    (["push", "/no/such/file.parquet"], "no such file"),
    (["push", "--target", "ftp", "x"], "invalid choice"),
    (["read", "--target", "ems"], "invalid choice"),
    (["frobnicate"], "invalid choice"),
])
def test_usage_errors_exit_2(args, mentions, tmp_path):
    code, _, err = run_main(*args, env={"SINK_TARGET": "dir", "SINK_DIR_PATH": str(tmp_path)})
    assert code == 2
    assert mentions in err


def test_not_a_parquet_file_exits_2(tmp_path):
    path = tmp_path / FILE_NAME
    path.write_text("hello")
    code, _, err = run_main("push", str(path), env={"SINK_TARGET": "dir", "SINK_DIR_PATH": str(tmp_path)})
    assert code == 2
    assert "not a readable Parquet file" in err


def test_read_formats(tmp_path, parquet_file):
    env = {"SINK_TARGET": "dir", "SINK_DIR_PATH": str(tmp_path / "out"), "SINK_PRIMARY_KEYS": "id"}
    assert run_main("push", str(parquet_file), env=env)[0] == 0
    code, out, _ = run_main("read", "--format", "csv", env=env)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == '"id","amount","_offset","_timestamp"'
    assert lines[1].startswith('"a",3.25,102,')
    code, out, _ = run_main("read", "--format", "table", env=env)
    assert code == 0
    assert out.splitlines()[0].split() == ["id", "amount", "_offset", "_timestamp"]
    assert out.rstrip().endswith("(2 rows)")
    code, out, _ = run_main("read", "--primary-keys", "", env=env)  # no keys: every row
    assert code == 0 and len(out.splitlines()) == 3


@pytest.fixture
def moto_s3(monkeypatch, tmp_path):
    env = {
        "AWS_ACCESS_KEY_ID": "testing-key-id",
        "AWS_SECRET_ACCESS_KEY": "testing-secret-key",
        "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    bucket = f"lake-{uuid.uuid4().hex[:12]}"  # moto keeps one store per process: no sharing across tests
    boto3.client("s3", endpoint_url=url, region_name="us-east-1").create_bucket(Bucket=bucket)
    yield url, bucket
    server.stop()


def test_push_dry_run_and_read_against_s3(moto_s3, parquet_file):
    url, bucket = moto_s3
    env = {"SINK_TARGET": "s3", "SINK_S3_BUCKET": bucket, "SINK_S3_PREFIX": "raw", "SINK_S3_ENDPOINT_URL": url,
           "SINK_S3_REGION": "us-east-1", "SINK_PRIMARY_KEYS": "id"}
    code, out, err = run_main("push", "--dry-run", str(parquet_file), env=env)
    assert code == 0, err
    request = json.loads(out)["request"]
    assert (request["bucket"], request["key"]) == (bucket, f"raw/{REL}")
    assert request["metadata"]["record-count"] == "3"
    assert request["metadata"]["primary-keys"] == "id"
    assert "testing-secret-key" not in out
    client = boto3.client("s3", endpoint_url=url, region_name="us-east-1")
    assert "Contents" not in client.list_objects_v2(Bucket=bucket)

    code, out, err = run_main("push", str(parquet_file), env=env)
    assert code == 0, err
    assert json.loads(out)["location"] == f"s3://{bucket}/raw/{REL}"
    code, out, err = run_main("read", env=env)
    assert code == 0, err
    assert [json.loads(line)["id"] for line in out.splitlines()] == ["a", "b"]

    code, _, err = run_main("push", str(parquet_file), env={**env, "SINK_S3_BUCKET": "missing-bucket"})
    assert code == 3
    assert "SINK_S3_BUCKET" in err and "NoSuchBucket" in err


def test_library_and_cli_stay_free_of_spark():
    code = (
        "import sys\n"
        "import uploader.cli, uploader.s3, uploader.directory, uploader.reader, uploader.__main__\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('pyspark', 'sink_service')]\n"
        "assert not bad, bad\n"
        "import sink_service.config, sink_service.config.upload_targets\n"
        "bad = [m for m in sys.modules if m.split('.')[0] == 'pyspark']\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)
