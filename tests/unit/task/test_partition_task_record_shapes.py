"""A range through decode, Parquet and upload with the record-shape settings (keys, tombstones, metadata)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from sink_service.decode import RAW_SCHEMA, DecodeSpec
from sink_service.task.partition_task import TaskSpec, process_range
from sink_service.task.ranges import Range
from uploader.reader import latest_per_key
from uploader.target import FileMetadata, Receipt


class Recorder:
    """A target that keeps each uploaded file and its metadata."""

    name = "recorder"

    def __init__(self, directory: Path):
        self.directory = directory
        self.uploads: list[tuple[FileMetadata, pa.Table]] = []

    def upload(self, path: Path, metadata: FileMetadata, on_retry=None) -> Receipt:
        kept = self.directory / metadata.file_name()
        shutil.copy(path, kept)
        self.uploads.append((metadata, pq.read_table(kept)))
        return Receipt("recorder", str(kept), None, kept.stat().st_size, 1, 0.0)

    def close(self) -> None:
        pass


def run(tmp_path: Path, decode: DecodeSpec, records: list[tuple[bytes | None, bytes | None]], *,
        policy: str = "fail", flush_records: int = 1000, batch: int = 10, compact: bool = False,
        ) -> tuple[dict, Recorder]:
    recorder = Recorder(tmp_path)
    # The worker caches one target per settings value: each run's settings are its own.
    spec = TaskSpec(decode=decode, target_settings=f"recorder-{id(recorder)}", build_target=lambda _: recorder,
                    table_template="{topic}", scratch_dir=str(tmp_path / "scratch"), flush_bytes=1 << 30,
                    flush_records=flush_records, compression="snappy", error_policy=policy, compact_files=compact)

    def read(rng: Range) -> Iterator[pa.RecordBatch]:
        for start in range(rng.start, rng.end, batch):
            yield pa.RecordBatch.from_pylist([
                {"topic": "t", "partition": 0, "offset": offset, "timestamp_ms": 0, "key": records[offset][0],
                 "value": records[offset][1], "headers": None}
                for offset in range(start, min(start + batch, rng.end))], schema=RAW_SCHEMA)

    outcome = process_range(spec, Range("t", 0, 0, len(records)), read).to_pylist()[0]
    return outcome, recorder


def test_skipped_tombstones_are_counted_but_do_not_stop_a_fail_policy_range(tmp_path):
    records = [(b"k", b'{"id": %d}' % i if i % 4 else None) for i in range(40)]
    outcome, recorder = run(tmp_path, DecodeSpec(None, ("id",), "_offset"), records)
    assert (outcome["status"], outcome["committable"]) == ("ok", 40)
    assert outcome["bad_records"] == 10 and json.loads(outcome["bad_reasons"]) == {"tombstone": 10}
    assert sum(t.num_rows for _, t in recorder.uploads) == 30


def test_tombstones_under_fail_stop_a_fail_policy_range_at_the_first(tmp_path):
    records = [(b"k", b'{"id": 0}'), (b"k", b'{"id": 1}'), (b"k", None), (b"k", b'{"id": 3}')]
    outcome, _ = run(tmp_path, DecodeSpec(None, ("id",), "_offset", tombstones="fail"), records)
    assert (outcome["status"], outcome["committable"]) == ("fatal", 2)
    assert "tombstone" in outcome["error"]


def test_every_file_names_the_primary_keys_learned_from_the_first_key(tmp_path):
    spec = DecodeSpec(None, (), "_offset", key_format="json", key_fields_prefix="k_", primary_keys_from_key=True)
    records = [(None if i < 3 else b'{"tenant": "a", "id": %d}' % i, b'{"v": %d}' % i) for i in range(50)]
    outcome, recorder = run(tmp_path, spec, records, policy="skip", flush_records=10)
    assert outcome["status"] == "ok"
    assert json.loads(outcome["bad_reasons"]) == {"missing_key": 3}  # no key: no primary key yet
    assert len(recorder.uploads) == 5
    assert {metadata.primary_keys for metadata, _ in recorder.uploads} == {("k_id", "k_tenant")}


def test_offset_is_left_out_of_the_file_unless_written(tmp_path):
    records = [(b"k", b'{"id": %d, "version": 1}' % i) for i in range(5)]
    spec = DecodeSpec(None, ("id",), "version", metadata_columns=("_timestamp",))
    _, recorder = run(tmp_path, spec, records)
    [(metadata, table)] = recorder.uploads
    assert table.column_names == ["id", "version", "_timestamp"]
    assert (metadata.first_offset, metadata.last_offset) == (0, 4)


# --- Schema evolution ----------------------------------------------------------------------------


def alternating(records: int, every: int) -> list[tuple[bytes, bytes]]:
    """Two record shapes, switching every `every` records: a new field each, padded to ~150 B."""
    pad = "p" * 100
    shapes = ('{"id": %d, "a": %d, "pad": "%s"}', '{"id": %d, "b": {"c": "s%d"}, "pad": "%s"}')
    return [(b"k", (shapes[(i // every) % 2] % (i, i, pad)).encode()) for i in range(records)]


def test_a_topic_alternating_between_two_shapes_gives_one_file_per_new_field_not_per_switch(tmp_path, monkeypatch):
    from sink_service.task import parquet_files
    monkeypatch.setattr(parquet_files, "ROW_GROUP_MAX_BYTES", 64 * 1024)  # rows reach disk between switches
    for every, files in ((1, 1), (500, 2)):
        out = tmp_path / str(every)
        out.mkdir()
        outcome, recorder = run(out, DecodeSpec(None, ("id",), "_offset"), alternating(6000, every), batch=500,
                                flush_records=100_000)
        assert (outcome["status"], outcome["bad_records"]) == ("ok", 0)
        assert len(recorder.uploads) == files  # 12 switches; the second shape's field rolls at most once
        table = pa.concat_tables([t for _, t in recorder.uploads], promote_options="default")
        assert table.column("id").to_pylist() == list(range(6000))
        assert table.column("a").null_count == table.column("b").null_count == 3000


def test_with_a_declared_schema_a_record_that_does_not_fit_is_a_bad_record_and_types_never_widen(tmp_path):
    from sink_service.shared.ddl import parse_ddl
    spec = DecodeSpec(parse_ddl("id BIGINT, qty INT, s STRUCT<c: STRING>"), ("id",), "_offset")
    records = [(b"k", b'{"id": 0, "qty": 1, "s": {"c": "x"}}'), (b"k", b'{"id": 1, "qty": "many"}'),
               (b"k", b'{"id": 2, "s": 5}'), (b"k", b'{"id": 3, "extra": true}')]
    (tmp_path / "skip").mkdir()
    outcome, recorder = run(tmp_path / "skip", spec, records, policy="skip")
    assert json.loads(outcome["bad_reasons"]) == {"schema_mismatch": 2}
    [(_, table)] = recorder.uploads
    assert table.select(["id", "qty", "s"]).schema == spec.value_schema
    assert table.column("id").to_pylist() == [0, 3]
    (tmp_path / "fail").mkdir()
    outcome, _ = run(tmp_path / "fail", spec, records, policy="fail")
    assert (outcome["status"], outcome["committable"]) == ("fatal", 1)


# --- In-file compaction --------------------------------------------------------------------------


def updates(keys: int, versions: int) -> list[tuple[bytes, bytes]]:
    """Every key updated `versions` times, keys interleaved, as an update-heavy topic is."""
    return [(b'{"id": %d}' % k, b'{"id": %d, "version": %d}' % (k, v)) for v in range(versions) for k in range(keys)]


def test_compaction_uploads_one_row_per_key_and_file_with_the_same_end_state(tmp_path):
    records = updates(keys=200, versions=10)
    spec = DecodeSpec(None, ("id",), "_offset")
    ends = {}
    for compact in (False, True):
        (tmp_path / str(compact)).mkdir()
        outcome, recorder = run(tmp_path / str(compact), spec, records, flush_records=500, batch=100, compact=compact)
        assert (outcome["status"], outcome["committable"]) == ("ok", 2000)
        rows = pa.concat_tables([t for _, t in recorder.uploads])
        ends[compact] = latest_per_key(rows, ("id",), "_offset").to_pylist()
        per_file = [t.num_rows for _, t in recorder.uploads]
        assert per_file == ([200] * 4 if compact else [500] * 4)  # 500 records, 2.5 versions of each key per file
        spans = [(m.first_offset, m.last_offset) for m, _ in recorder.uploads]
        assert spans == [(i, i + 499) for i in range(0, 2000, 500)]
        assert outcome["records_uploaded"] == sum(per_file)
    assert ends[True] == ends[False]
    assert {row["version"] for row in ends[True]} == {9}


def test_compaction_follows_primary_keys_learned_from_json_keys(tmp_path):
    spec = DecodeSpec(None, (), "_offset", key_format="json", key_fields_prefix="k_", primary_keys_from_key=True)
    _, recorder = run(tmp_path, spec, updates(keys=30, versions=5), flush_records=1000, batch=40, compact=True)
    [(metadata, table)] = recorder.uploads
    assert metadata.primary_keys == ("k_id",)
    assert table.num_rows == 30 and set(table.column("version").to_pylist()) == {4}
