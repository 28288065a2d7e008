"""SINK_TRANSFORM_SQL inside a task: bad records found by bisection, filtered records still committed."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

from sink_service.config import load_config, transform_for
from sink_service.decode import DecodeSpec
from sink_service.task.partition_task import TaskSpec, process_range
from sink_service.task.ranges import Range
from tests.unit.task.test_partition_task import reader, spec

CAST = "SELECT id, CAST(amount AS INT) AS amount, status FROM records"


def task(tmp_path: Path, sql: str, *, policy: str = "skip", primary_keys: tuple[str, ...] = ("id",),
         flush_records: int = 100) -> TaskSpec:
    """A task spec whose transform comes from the configuration, as the service builds it."""
    config = load_config({"SINK_KAFKA_BOOTSTRAP_SERVERS": "k:9092", "SINK_TOPICS": "t", "SINK_TARGET": "dir",
                          "SINK_DIR_PATH": str(tmp_path / "out"), "SINK_TRANSFORM_SQL": sql,
                          "SINK_PRIMARY_KEYS": ",".join(primary_keys)})
    return dataclasses.replace(spec(tmp_path, policy, flush_records), transform=transform_for(config),
                               decode=DecodeSpec(None, primary_keys, "_offset"))


def orders(n: int, *, amount_at: dict[int, str] | None = None, status=lambda i: "paid") -> list[bytes]:
    amounts = amount_at or {}
    return [json.dumps({"id": str(i), "amount": amounts.get(i, str(i)), "status": status(i)}).encode()
            for i in range(n)]


def uploaded(tmp_path: Path) -> list[dict]:
    files = sorted((tmp_path / "out").rglob("*.parquet"))
    return [row for f in files for row in pq.read_table(f).to_pylist()]


def file_offsets(tmp_path: Path) -> list[tuple[int, int]]:
    names = sorted(p.stem for p in (tmp_path / "out").rglob("*.parquet"))
    return [tuple(int(n) for n in name.split("-")) for name in names]


def test_a_record_the_cast_fails_on_is_a_transform_failed_bad_record_and_the_rest_are_written(tmp_path):
    log = orders(300, amount_at={170: "abc"})
    outcome = process_range(task(tmp_path, CAST), Range("t", 0, 0, 300), reader(log)).to_pylist()[0]

    assert outcome["status"] == "ok", outcome["error"]
    assert outcome["committable"] == 300
    assert json.loads(outcome["bad_reasons"]) == {"transform_failed": 1}
    [sample] = json.loads(outcome["bad_samples"])
    assert sample.startswith("topic=t partition=0 offset=170: SINK_TRANSFORM_SQL failed: Conversion Error")
    assert "'abc'" in sample
    rows = uploaded(tmp_path)
    assert [r["id"] for r in rows] == [str(i) for i in range(300) if i != 170]
    assert [r["amount"] for r in rows] == [i for i in range(300) if i != 170]  # cast to INT
    assert outcome["records_uploaded"] == 299


def test_under_fail_the_failing_record_stops_the_range_at_its_offset(tmp_path):
    log = orders(300, amount_at={170: "abc"})
    outcome = process_range(task(tmp_path, CAST, policy="fail"), Range("t", 0, 0, 300), reader(log)).to_pylist()[0]

    assert outcome["status"] == "fatal"
    assert outcome["committable"] == 170
    assert "offset=170" in outcome["error"] and "Conversion Error" in outcome["error"]
    assert [r["id"] for r in uploaded(tmp_path)] == [str(i) for i in range(170)]


def test_records_the_where_filters_out_are_committed_to_the_range_end(tmp_path):
    """The last 60 records are all filtered out: no file covers them, yet the range commits to its end."""
    log = orders(300, status=lambda i: "test" if i % 3 == 0 or i >= 240 else "paid")
    sql = "SELECT * FROM records WHERE status <> 'test'"
    outcome = process_range(task(tmp_path, sql, flush_records=50), Range("t", 0, 0, 300), reader(log)).to_pylist()[0]

    kept = [str(i) for i in range(240) if i % 3]
    assert outcome["status"] == "ok", outcome["error"]
    assert outcome["committable"] == 300
    assert outcome["bad_records"] == 0
    assert outcome["records_filtered"] == 300 - len(kept)
    assert [r["id"] for r in uploaded(tmp_path)] == kept
    # SINK_FLUSH_RECORDS counts written rows, as without a transform: 160 rows in files of 50, 50, 50, 10,
    # each named by the offsets of its first and last row.
    files = [kept[i:i + 50] for i in range(0, len(kept), 50)]
    assert file_offsets(tmp_path) == [(int(rows[0]), int(rows[-1])) for rows in files]
    assert [len(rows) for rows in files] == [50, 50, 50, 10]


def test_a_range_the_where_filters_out_entirely_commits_with_no_file(tmp_path):
    sql = "SELECT * FROM records WHERE status = 'never'"
    outcome = process_range(task(tmp_path, sql), Range("t", 0, 100, 200), reader(orders(200))).to_pylist()[0]
    assert (outcome["status"], outcome["committable"], outcome["records_filtered"]) == ("ok", 200, 100)
    assert not list((tmp_path / "out").rglob("*.parquet"))


def test_primary_keys_name_the_statements_output(tmp_path):
    """A renamed key is checked after the statement: no record lacks it. One the statement turns
    NULL is a record without a key."""
    sql = "SELECT TRY_CAST(id AS INT) AS order_id, status FROM records"
    log = orders(100)
    log[42] = json.dumps({"id": "forty-two", "amount": "1", "status": "paid"}).encode()
    outcome = process_range(task(tmp_path, sql, primary_keys=("order_id",)), Range("t", 0, 0, 100),
                            reader(log)).to_pylist()[0]

    assert outcome["committable"] == 100
    assert json.loads(outcome["bad_reasons"]) == {"missing_key": 1}
    assert json.loads(outcome["bad_samples"]) == [
        "topic=t partition=0 offset=42: primary key field `order_id` is missing or null after SINK_TRANSFORM_SQL"]
    assert [r["order_id"] for r in uploaded(tmp_path)] == [i for i in range(100) if i != 42]


def test_tasks_import_no_transform_or_s3_code_they_do_not_use(tmp_path):
    """A task that decodes JSON, writes and uploads a range to a directory loads neither the
    transform's engines (duckdb, sqlglot) nor boto3 (~9 MB and ~80 ms in every Python worker), nor the
    Avro and Protobuf decoders (~55 ms)."""
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from sink_service.task.ranges import Range\n"
        "from sink_service.task.partition_task import process_range\n"
        "from tests.unit.task.test_partition_task import reader, spec, topic_log\n"
        f"out = process_range(spec(Path({str(tmp_path)!r})), Range('t', 0, 0, 100), reader(topic_log(100, set())))\n"
        "assert out.to_pylist()[0]['committable'] == 100\n"
        "print(sorted(m for m in ('duckdb', 'sqlglot', 'boto3', 'botocore', 'fastavro', 'google.protobuf') "
        "if m in sys.modules))\n"
    )
    root = Path(__file__).resolve().parents[3]
    result = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
