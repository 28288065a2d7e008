"""One range end to end in a task (decode, Parquet, dir target): failures are blamed on records."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sink_service.config.upload_targets import build_target
from sink_service.decode import RAW_SCHEMA, DecodeSpec
from sink_service.kafka_source.planner_hints import PlannerHints
from sink_service.task import parquet_files
from sink_service.task.outcomes import ERROR_PROCESSING, ERROR_READ
from sink_service.task.partition_task import TaskSpec, process_range
from sink_service.task.ranges import Range
from uploader.column_types import decode_schema, encode_schema
from uploader.directory import DirectorySettings
from uploader.retry import RetryPolicy

POISON = b'{"id": "poison", "version": 0}'


def spec(tmp_path: Path, policy: str = "skip", flush_records: int = 1000) -> TaskSpec:
    return TaskSpec(
        decode=DecodeSpec(None, ("id",), "_offset"),
        target_settings=DirectorySettings(path=str(tmp_path / "out"), retry=RetryPolicy(max_elapsed_s=1)),
        build_target=build_target,
        table_template="{topic}",
        scratch_dir=str(tmp_path / "scratch"),
        flush_bytes=1 << 30,
        flush_records=flush_records,
        compression="snappy",
        error_policy=policy,
    )


def raw_batch(values: list[bytes], first_offset: int) -> pa.RecordBatch:
    n = len(values)
    return pa.RecordBatch.from_arrays([
        pa.array(["t"] * n), pa.array([0] * n, pa.int32()),
        pa.array(range(first_offset, first_offset + n), pa.int64()), pa.array([0] * n, pa.int64()),
        pa.array([None] * n, pa.binary()), pa.array(values, pa.binary()), pa.nulls(n, RAW_SCHEMA.field("headers").type),
    ], schema=RAW_SCHEMA)


def topic_log(n: int, poison_at: set[int]) -> list[bytes]:
    return [POISON if i in poison_at else json.dumps({"id": str(i), "version": i}).encode() for i in range(n)]


def reader(log: list[bytes], batch: int = 50):
    def read(rng: Range) -> Iterator[pa.RecordBatch]:
        for start in range(rng.start, rng.end, batch):
            yield raw_batch(log[start:min(start + batch, rng.end)], start)
    return read


@pytest.fixture
def unwritable_poison(monkeypatch):
    """A record the Parquet writer rejects, as Arrow does for e.g. a value over its capacity."""
    real = parquet_files.pq.ParquetWriter.write_table

    def write_table(self, table, *args, **kwargs):
        if "poison" in table.column("id").to_pylist():
            raise pa.ArrowCapacityError("value too large for one Parquet page")
        return real(self, table, *args, **kwargs)

    monkeypatch.setattr(parquet_files.pq.ParquetWriter, "write_table", write_table)


def uploaded_ids(tmp_path: Path) -> list[str]:
    files = sorted((tmp_path / "out").rglob("*.parquet"))
    return [i for f in files for i in pq.read_table(f).column("id").to_pylist()]


def test_an_unwritable_record_is_a_bad_record_not_a_replay_loop(tmp_path, unwritable_poison):
    log = topic_log(300, poison_at={170})
    outcome = process_range(spec(tmp_path, flush_records=100), Range("t", 0, 0, 300), reader(log)).to_pylist()[0]
    assert outcome["status"] == "ok", outcome["error"]
    assert outcome["committable"] == 300
    assert outcome["bad_records"] == 1
    assert json.loads(outcome["bad_reasons"]) == {"unwritable": 1}
    [sample] = json.loads(outcome["bad_samples"])
    assert sample.startswith("topic=t partition=0 offset=170: cannot be written: ArrowCapacityError")
    assert sorted(uploaded_ids(tmp_path), key=int) == [str(i) for i in range(300) if i != 170]


def test_under_fail_an_unwritable_record_stops_at_its_offset(tmp_path, unwritable_poison):
    log = topic_log(300, poison_at={170})
    outcome = process_range(spec(tmp_path, "fail", 100), Range("t", 0, 0, 300), reader(log)).to_pylist()[0]
    assert outcome["status"] == "fatal"
    assert outcome["committable"] == 170
    assert "offset=170" in outcome["error"] and "SINK_ERROR_POLICY" in outcome["error"]
    assert sorted(uploaded_ids(tmp_path), key=int) == [str(i) for i in range(170)]


def test_a_read_failure_is_an_outage_not_a_record_problem(tmp_path):
    log = topic_log(300, poison_at=set())

    def read(rng: Range) -> Iterator[pa.RecordBatch]:
        yield from reader(log)(Range("t", 0, rng.start, 150))
        raise TimeoutError("no data from topic=t partition=0 at offset 150")

    outcome = process_range(spec(tmp_path, flush_records=100), Range("t", 0, 0, 300), read).to_pylist()[0]
    assert (outcome["status"], outcome["error_kind"]) == ("retryable", ERROR_READ)
    assert outcome["committable"] == 100  # the first file was uploaded; the open one is dropped


def test_an_error_no_record_explains_is_reported_for_counting(tmp_path, monkeypatch):
    def broken(self, table, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(parquet_files.pq.ParquetWriter, "write_table", broken)
    outcome = process_range(spec(tmp_path), Range("t", 0, 0, 100), reader(topic_log(100, set()))).to_pylist()[0]
    assert (outcome["status"], outcome["error_kind"]) == ("retryable", ERROR_PROCESSING)
    assert outcome["committable"] == 0 and "No space left" in outcome["error"]


def test_the_topics_widest_types_are_the_floor_of_later_files(tmp_path):
    """Another task already wrote `version` as text: this range's integers follow, as text."""
    floor = pa.schema([("version", pa.string())])
    outcome = process_range(spec(tmp_path), Range("t", 0, 0, 20), reader(topic_log(20, set())), floor).to_pylist()[0]
    [written] = sorted((tmp_path / "out").rglob("*.parquet"))
    assert pq.read_schema(written).field("version").type == pa.string()
    assert pq.read_table(written).column("version").to_pylist() == [str(i) for i in range(20)]
    assert decode_schema(outcome["written_schema"]).field("version").type == pa.string()


def test_a_range_reports_only_what_it_added_to_its_floor(tmp_path):
    """The driver learns a topic's types from these: nothing new is "", so it never decodes a schema."""
    def written(partition: int, start: int, floor: pa.Schema | None) -> str:
        rng = Range("t", partition, start, start + 20)
        return process_range(spec(tmp_path), rng, reader(topic_log(start + 20, set())), floor).to_pylist()[0][
            "written_schema"]

    first = decode_schema(written(0, 0, None))  # no floor yet: all it wrote
    assert first.field("version").type == pa.int64() and "id" in first.names
    assert written(0, 20, first) == ""
    texts = pa.schema([(f.name, pa.string() if f.name == "version" else f.type) for f in first])
    assert written(1, 0, pa.schema([*texts, ("gone", pa.int64())])) == ""  # versions as text; a column it lacks
    joined = decode_schema(written(2, 0, pa.schema([("elsewhere", pa.float64())])))
    assert joined.names[0] == "elsewhere" and joined.field("version").type == pa.int64()


def test_planner_hints_take_a_first_range_as_is_and_skip_ranges_that_added_nothing():
    hints = PlannerHints()
    first = encode_schema(pa.schema([("x", pa.int64())]))
    hints.learn_types("t", first)
    hints.learn_types("t", "")
    hints.learn_types("t", first)
    assert hints.column_types == {"t": first}


def test_planner_hints_join_the_types_of_every_range(tmp_path):
    hints = PlannerHints()
    hints.learn_types("t", encode_schema(pa.schema([("x", pa.int64()), ("a", pa.string())])))
    hints.learn_types("t", encode_schema(pa.schema([("x", pa.string()), ("b", pa.float64())])))
    hints.learn_types("t", "")
    hints.learn_size("t", 1000, 10)
    hints.save(tmp_path)
    loaded = PlannerHints.load(tmp_path)
    assert decode_schema(loaded.column_types["t"]) == pa.schema(
        [("x", pa.string()), ("a", pa.string()), ("b", pa.float64())])
    assert loaded.bytes_per_record == {"t": 100.0}
    assert PlannerHints.load(tmp_path / "missing") == PlannerHints()
