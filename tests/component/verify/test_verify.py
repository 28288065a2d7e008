"""`sink-service verify` against targets built by the real task code from a real broker's records,
then damaged in known ways: a removed file (a lost upload), a stale row, an extra key; on dir, S3
(moto's server), local_ems and a Delta table."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from sink_service.config import load_config
from sink_service.verify.run import VerifyOptions, verify
from tests.component.verify.sinking import (
    AUTH,
    COMMITTED,
    KEYS,
    LAST_FILE,
    MIDDLE_FILE,
    ROOT,
    SUNK,
    TOPIC,
    build,
    run_verify,
)

KINDS = ["dir", "s3", "ems", "delta"]


@pytest.mark.parametrize("kind", KINDS)
def test_an_exact_target_is_equal(kind, bootstrap, topic, tmp_path, request):
    target = build(kind, bootstrap, tmp_path, request)
    report = run_verify(target)
    totals = report.totals()
    assert report.equal, report.to_text()
    assert totals["keys_checked"] == totals["keys_equal"] == KEYS * len(SUNK)
    assert totals["deleted"] == len(SUNK)  # k0-3 and k1-3: the deletion row (or nothing) is equal
    assert sum(p.records for p in report.partitions) == COMMITTED * len(SUNK)  # nothing past the commits
    assert [p.partition for p in report.partitions if p.committed is None] == [2]
    assert "2 no committed offset" in report.to_text().replace(f"{TOPIC}:", "")


@pytest.mark.parametrize("kind", KINDS)
def test_a_removed_file_is_reported_as_missing_keys_with_their_offsets(kind, bootstrap, topic, tmp_path, request):
    target = build(kind, bootstrap, tmp_path, request, drop_last=True)
    if kind in ("dir", "s3"):
        target.remove(0, LAST_FILE)
    report = run_verify(target, examples=3)
    [table] = report.tables
    assert not report.equal
    assert table.counts["missing"] == 5  # k0-10..14, only in the removed file
    assert [(e["key"]["_key"], e["topic"], e["partition"], e["offset"]) for e in table.examples["missing"]] == [
        ("k0-10", TOPIC, 0, 21), ("k0-11", TOPIC, 0, 22), ("k0-12", TOPIC, 0, 23)]
    assert table.counts["stale"] == 1  # k0-3: its deletion was in the removed file
    assert table.examples["stale"][0]["offset"] == 20
    assert table.counts["extra"] == table.counts["differing"] == 0


@pytest.mark.parametrize("kind", KINDS)
def test_a_stale_row_is_reported(kind, bootstrap, topic, tmp_path, request):
    target = build(kind, bootstrap, tmp_path, request)
    if kind == "ems":
        target.sql(f'UPDATE "{TOPIC}" SET _offset = 5, version = 0 WHERE _key = ?', "k1-5")
    elif kind == "delta":
        target.delta().update(updates={"_offset": "5", "version": "0"}, predicate="_key = 'k1-5'")
    else:  # the middle file's k1-5 row replaced by the first file's (version 0, offset 5)
        middle, first = target.file(1, MIDDLE_FILE), target.file(1, f"{0:020d}-{9:020d}.parquet")
        keep = middle.filter(pc.not_equal(middle["_key"], "k1-5"))
        target.put(1, MIDDLE_FILE, pa.concat_tables([keep, first.filter(pc.equal(first["_key"], "k1-5"))]))
    report = run_verify(target)
    [table] = report.tables
    assert table.counts["stale"] == 1, report.to_text()
    [example] = table.examples["stale"]
    assert (example["key"], example["partition"], example["offset"]) == ({"_key": "k1-5"}, 1, 15)
    assert (example["expected_order"], example["target_order"]) == ("15", "5")
    assert sum(table.counts[s] for s in ("missing", "extra", "differing")) == 0


@pytest.mark.parametrize("kind", KINDS)
def test_an_extra_key_is_reported(kind, bootstrap, topic, tmp_path, request):
    target = build(kind, bootstrap, tmp_path, request)
    if kind == "ems":
        target.sql(f'INSERT INTO "{TOPIC}" (_key, _offset, id, version) VALUES (?, ?, ?, ?)', "ghost", 3, "ghost", 0)
    elif kind == "delta":
        from deltalake import write_deltalake

        rows = target.delta().to_pyarrow_table()
        row = rows.filter(pc.equal(rows["_key"], "k0-1"))
        write_deltalake(target.env["SINK_DELTA_TABLE_URI"],
                        row.set_column(row.schema.get_field_index("_key"), "_key", pa.array(["ghost"])), mode="append")
    else:
        first = target.file(0, f"{0:020d}-{9:020d}.parquet").slice(0, 1)
        ghost = first.set_column(first.schema.get_field_index("_key"), "_key", pa.array(["ghost"]))
        target.put(0, f"{0:020d}-{0:020d}.parquet", ghost)
    report = run_verify(target)
    [table] = report.tables
    assert table.counts["extra"] == 1, report.to_text()
    assert table.examples["extra"][0]["key"] == {"_key": "ghost"}
    assert table.counts["equal"] == KEYS * len(SUNK)


def test_uploaded_but_uncommitted_files_are_not_compared(bootstrap, topic, tmp_path, request):
    """The service uploads, then commits: a file at or past the committed offset is not counted."""
    target = build("dir", bootstrap, tmp_path, request)
    ahead = target.file(0, LAST_FILE)
    target.put(0, f"{26:020d}-{27:020d}.parquet", ahead)
    report = run_verify(target)
    assert report.equal and report.uncommitted_files == 1


def _cli(env: dict[str, str], *arguments: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SINK_")}
    return subprocess.run([sys.executable, "-m", "sink_service", "verify", *arguments], env={**clean, **env},
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_the_command_exits_0_when_equal_and_1_with_json_when_not(bootstrap, topic, tmp_path, request):
    target = build("dir", bootstrap, tmp_path, request)
    equal = _cli(target.env)
    assert equal.returncode == 0, equal.stderr
    assert "result: EQUAL" in equal.stdout
    target.remove(1, LAST_FILE)
    damaged = _cli(target.env, "--json", "--examples", "1")
    assert damaged.returncode == 1, damaged.stderr
    found = json.loads(damaged.stdout)
    assert (found["equal"], found["missing"], found["stale"]) == (False, 5, 1)
    assert found["tables"][0]["examples"]["missing"] == [
        {"key": {"_key": "k1-10"}, "expected_order": "21", "topic": TOPIC, "partition": 1, "offset": 21}]


def test_the_real_ems_cannot_be_read_back_but_an_export_can_be_compared(bootstrap, topic, tmp_path, request):
    exported = build("dir", bootstrap, tmp_path, request)  # Parquet files such as an export holds
    env = {**exported.env, "SINK_TARGET": "ems", "SINK_EMS_AUTHORIZATION": AUTH, "SINK_EMS_TARGET_TABLE": "{topic}",
           "SINK_EMS_ENDPOINT": "https://team.realm.celonis.cloud/continuous-batch-processing/api/v1/pool/items"}
    del env["SINK_DIR_PATH"]
    refused = _cli(env)
    assert refused.returncode == 2
    assert "no read-back" in refused.stderr and "--target-export" in refused.stderr
    report = verify(load_config(env), VerifyOptions(target_export=tmp_path / "out", temp_dir=tmp_path))
    assert report.equal, report.to_text()


def test_a_configuration_error_is_exit_2():
    result = _cli({"SINK_TARGET": "dir"})
    assert result.returncode == 2
    assert "SINK_KAFKA_BOOTSTRAP_SERVERS" in result.stderr


def test_a_sink_without_primary_keys_cannot_be_verified():
    """Rows are appended then, not upserted: there is no latest row per key. Refused before any connection."""
    result = _cli({"SINK_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9", "SINK_TOPICS": "t", "SINK_TARGET": "dir",
                   "SINK_DIR_PATH": "/nonexistent"})
    assert result.returncode == 2
    assert "SINK_PRIMARY_KEYS is not set" in result.stderr
