"""The topic side: every record up to the group's committed offsets, as the rows the service writes,
and, apart, the records past them up to the log end.

The records are read with the tasks' range reader and decoded with the tasks' own code
(`sink_service.decode.decode`, the transform, and the task's split of unreadable headers and its
record-by-record pass for a batch that cannot be written), under the `DecodeSpec` the service builds
(`sink_service.config.decode_spec`). The rows are written, a bounded batch at a time, by the
task's `PartitionFileWriter` into spill Parquet files: the same widening of types, so they compare
with the target's files column for column. Nothing is kept per key in Python: duckdb later finds
the latest row per key in these files (`compare.py`).

The records past the committed offsets are decoded the same way into files of their own: the
service uploads before it commits, so a target may hold them already (`ahead`), and such a row is
only right if a record past the commits holds it.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
from confluent_kafka.admin import AdminClient

from sink_service.config import SinkConfig
from sink_service.decode import DecodedChunk, DecodeSpec, decode
from sink_service.kafka_source.offsets import KafkaOffsets
from sink_service.task.parquet_files import PartitionFileWriter
from sink_service.task.partition_task import DATA_ERRORS, _bisect_unwritable, _readable_runs
from sink_service.task.range_reader import consumer_config, read_range
from sink_service.task.ranges import Range
from sink_service.transform.rows import Transform
from uploader.column_types import join_schemas

TP = tuple[str, int]
# Bookkeeping columns of the spill files: where each row came from.
TOPIC_COLUMN = "__verify_topic"
PARTITION_COLUMN = "__verify_partition"
SPILL_FILE_BYTES = 64 * 1024 * 1024


@dataclass
class PartitionRead:
    """What was read of one topic-partition."""

    topic: str
    partition: int
    earliest: int
    committed: int | None  # None: the group has no commit here, nothing is counted
    end: int | None = None  # the log end (last stable offset) when verify started
    records: int = 0
    rows: int = 0
    beyond_records: int = 0  # past the committed offset, up to `end`

    @property
    def beyond_start(self) -> int:
        """Where the records past the commit start: the commit, or the log start without one."""
        return self.earliest if self.committed is None else max(self.committed, self.earliest)

    @property
    def note(self) -> str:
        if self.committed is None:
            return "no committed offset: nothing counted from it"
        if self.committed < self.earliest:
            return (f"committed offset {self.committed} is below the earliest available {self.earliest}: "
                    "retention deleted records the target may hold")
        return ""


@dataclass
class ExpectedRows:
    """The spill files and what reading the topics found."""

    files: list[tuple[str, Path]] = field(default_factory=list)  # (topic, spill file)
    beyond_files: list[tuple[str, Path]] = field(default_factory=list)  # past the committed offsets
    partitions: list[PartitionRead] = field(default_factory=list)
    primary_keys: tuple[str, ...] = ()  # the spec's, or learned from the keys' fields
    bad_records: Counter = field(default_factory=Counter)  # kind -> count (tombstones under `skip` included)
    filtered: int = 0  # left out by SINK_TRANSFORM_SQL's WHERE

    def committed(self) -> dict[TP, int]:
        return {(p.topic, p.partition): p.committed for p in self.partitions if p.committed is not None}


def topics_of(config: SinkConfig) -> list[str]:
    """SINK_TOPICS, or the topics SINK_TOPIC_PATTERN matches in full right now."""
    if config.topics:
        return list(config.topics)
    admin = AdminClient(config.kafka_client_config())
    pattern = re.compile(config.topic_pattern or "")
    names = admin.list_topics(timeout=30).topics
    return sorted(name for name in names if pattern.fullmatch(name) and not name.startswith("__"))


def partitions_of(config: SinkConfig, topics: list[str]) -> list[TP]:
    admin = AdminClient(config.kafka_client_config())
    metadata = admin.list_topics(timeout=30).topics
    missing = [t for t in topics if t not in metadata or metadata[t].error is not None]
    if missing:
        raise LookupError(f"topic(s) {', '.join(missing)} not found on {config.kafka_bootstrap_servers}")
    return sorted((t, p) for t in topics for p in metadata[t].partitions)


def positions(config: SinkConfig, tps: list[TP]) -> list[PartitionRead]:
    """Each partition's earliest offset, the group's committed offset and the log end."""
    offsets = KafkaOffsets(config.kafka_client_config(), config.group_id)
    earliest = offsets.earliest(tps)
    committed = offsets.committed(tps)
    latest = offsets.latest(tps)
    return [PartitionRead(t, p, earliest[(t, p)], committed.get((t, p)), latest[(t, p)]) for t, p in tps]


Reader = Callable[[Range], Iterator[pa.RecordBatch]]


def read_expected(config: SinkConfig, spec: DecodeSpec, transform: Transform | None, spill_dir: Path,
                  parts: list[PartitionRead], read: Reader | None = None) -> ExpectedRows:
    """Decode every partition's records below its committed offset into spill files under
    `spill_dir`/committed, and those from there to the log end under `spill_dir`/beyond."""
    own_reader = read is None
    if read is None:
        client = consumer_config(config.kafka_client_config(), config.group_id)

        def read(rng: Range) -> Iterator[pa.RecordBatch]:
            return read_range(rng, client, config.read_batch_max_bytes)

    found = ExpectedRows(partitions=parts, primary_keys=spec.primary_keys)
    floor: pa.Schema | None = None
    beyond = _Tally()  # bad records and filtered rows past the commits are not the committed counts

    def spill(rng: Range, directory: Path, files: list[tuple[str, Path]],
              tally: ExpectedRows | _Tally) -> tuple[int, int]:
        """(records, rows) of one range, decoded into spill files under `directory`."""
        nonlocal spec, floor
        writer = PartitionFileWriter(
            directory, rng.topic, rng.partition, max_bytes=SPILL_FILE_BYTES, max_records=1 << 62,
            compression="zstd", on_close=lambda closed: files.append((closed.topic, closed.path)), floor=floor)
        records, rows, spec = _decode_range(rng, spec, transform, read, writer, tally)
        writer.finish()
        if writer.written_schema is not None:
            floor = writer.written_schema if floor is None else join_schemas(floor, writer.written_schema)
        return records, rows

    for part in parts:
        if part.committed is not None and part.committed > part.earliest:
            part.records, part.rows = spill(Range(part.topic, part.partition, part.earliest, part.committed),
                                            spill_dir / "committed", found.files, found)
        if part.end is not None and part.end > part.beyond_start:
            part.beyond_records, _ = spill(Range(part.topic, part.partition, part.beyond_start, part.end),
                                           spill_dir / "beyond", found.beyond_files, beyond)
    found.primary_keys = spec.primary_keys
    if own_reader:
        _release(config)
    return found


def _release(config: SinkConfig) -> None:
    """Close the cached consumer and hand the read's memory back before duckdb takes its share."""
    from sink_service.task import range_reader
    from sink_service.task.heap_release import release_if_grown

    range_reader._discard(consumer_config(config.kafka_client_config(), config.group_id))
    pa.default_memory_pool().release_unused()
    release_if_grown()


class _Tally:
    """What a read found besides rows: `ExpectedRows` for the committed records, a throwaway past them."""

    def __init__(self) -> None:
        self.bad_records: Counter = Counter()
        self.filtered = 0


def _decode_range(rng: Range, spec: DecodeSpec, transform: Transform | None, read: Reader,
                  writer: PartitionFileWriter, tally: ExpectedRows | _Tally) -> tuple[int, int, DecodeSpec]:
    """Decode as a task does; returns the records read, the rows written and the spec with the
    primary keys learned from the keys, if so."""
    records = rows = 0
    for raw in read(rng):
        records += raw.num_rows
        for piece, bad in _readable_runs(raw):
            if bad is not None:
                tally.bad_records[bad.kind] += 1
                continue
            for chunk in _decoded(piece, spec, transform):
                if chunk.primary_keys != spec.primary_keys:
                    spec = dataclasses.replace(spec, primary_keys=chunk.primary_keys)
                tally.filtered += chunk.filtered
                for record in (*chunk.bad_records, *chunk.skipped):
                    tally.bad_records[record.kind] += 1
                for segment in chunk.segments:
                    rows += segment.num_rows
                    writer.append(_with_origin(segment, rng.topic, rng.partition))
    return records, rows, spec


def _decoded(raw: pa.RecordBatch, spec: DecodeSpec, transform: Transform | None) -> Iterator[DecodedChunk]:
    """The task's two passes: the whole batch, else halves until the records at fault are found."""
    try:
        yield decode(raw, spec, transform)
    except DATA_ERRORS:
        yield from _bisect_unwritable(raw, spec, transform)


def _with_origin(segment: pa.Table, topic: str, partition: int) -> pa.Table:
    n = segment.num_rows
    return (segment.append_column(TOPIC_COLUMN, pa.repeat(pa.scalar(topic, pa.string()), n))
            .append_column(PARTITION_COLUMN, pa.repeat(pa.scalar(partition, pa.int32()), n)))
