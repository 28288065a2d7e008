"""The Kafka source as a Spark Python DataSource (streaming reader with admission control).

Planning (`latestOffset`, `partitions`) runs in one Python process beside the driver JVM;
`read` runs inside executor tasks, one task per topic-partition offset range.

Spark starts a Python process for each planning step of a query (creating the source, its
streaming reader, planning the read), one after the other before the first batch, and each
imports this module. So only planning imports live at the top; the executor side (decoding,
Parquet, upload) is imported by `read`, which saves ~0.3 s and ~35 MB in each planning process.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import gc
import heapq
import json
import logging
import pickle
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit

from sink_service.kafka_source.admission import Admission, Thresholds
from sink_service.kafka_source.planner_hints import PlannerHints
from sink_service.kafka_source.positions import TP, OffsetGapError, flatten, nest
from sink_service.task.outcomes import RESULT_SCHEMA_DDL
from sink_service.task.ranges import Range

if TYPE_CHECKING:
    import pyarrow as pa

    from sink_service.kafka_source.offsets import KafkaOffsets
    from sink_service.task.partition_task import TaskSpec
    from sink_service.task.recipe import TaskRecipe

log = logging.getLogger(__name__)

FORMAT_NAME = "kafka_tp_ranges"
# Small ranges a task processes at once (threads): their uploads overlap (see `read`).
RANGES_IN_FLIGHT = 4
PENDING_STATE_FILE = "pending.json"


@dataclass(frozen=True)
class SourceOptions:
    """Everything the source needs, passed as one JSON option (Spark options are strings)."""

    client_config: dict[str, str]
    group_id: str
    # The partitions the consumer group assigned this instance, resolved by the driver right before
    # start: the query plans exactly these. New topics and partitions arrive by a rebalance.
    starting_positions: dict[str, dict[str, int]]
    flush_records: int
    flush_bytes: int
    flush_interval_ms: int
    max_files_per_batch: int
    max_batch_records: int
    # One wave of tasks: the first batch holds this many files, and every batch's ranges are
    # dealt into this many tasks.
    executor_cores: int
    retention_gap_policy: str
    read_batch_max_bytes: int
    state_dir: str  # planner <-> driver hints (size estimates, pending state); never needed for correctness
    task: str  # the pickled TaskRecipe (the configuration tasks build their spec from), base64
    # The driver's logging settings (`logs.WorkerLogging` as a dict), for the planner's own process:
    # without them its WARNINGs went out unformatted and unscrubbed, and its INFO lines not at all.
    logging: dict | None = None

    def to_option(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def pack_task(recipe: TaskRecipe) -> str:
        return base64.b64encode(pickle.dumps(recipe)).decode()

    def task_spec(self) -> TaskSpec:
        return _task_spec(self.task)

    @classmethod
    def from_option(cls, text: str) -> SourceOptions:
        return cls(**json.loads(text))


@dataclass(frozen=True)
class PlannedRange:
    range: Range
    column_types: str = ""  # the topic's widest written types, encoded: the files' floor


class KafkaRangePartition(InputPartition):
    """One Spark task: the ranges of different topic-partitions it reads, decodes and uploads in turn."""

    def __init__(self, ranges: list[PlannedRange]):
        super().__init__(ranges)
        self.ranges = ranges


def bundle(ranges: list[PlannedRange], tasks: int) -> list[KafkaRangePartition]:
    """Deal the ranges into at most `tasks` tasks of about equal records, largest range first.

    Each Spark task costs about 25 ms of fixed CPU (measured at 20k records/s: ~14 ms in the JVM
    to launch it and turn its output into rows, ~10 ms in the Python worker between tasks), so
    one task per range made a batch of 8 small files pay 8 times that on 2 cores. A partition
    still has exactly one range per batch, read and uploaded in offset order; only unrelated
    partitions share a task.
    """
    tasks = max(1, min(tasks, len(ranges)))
    members: list[list[PlannedRange]] = [[] for _ in range(tasks)]
    loads = [(0, n) for n in range(tasks)]  # a heap of (records, task)
    for planned in sorted(ranges, key=lambda p: (-p.range.records, p.range.topic, p.range.partition)):
        records, n = heapq.heappop(loads)
        members[n].append(planned)
        heapq.heappush(loads, (records + planned.range.records, n))
    return [KafkaRangePartition(ranges) for ranges in members if ranges]


class KafkaRangeDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> str:
        return RESULT_SCHEMA_DDL  # only when the query gives none: the driver passes it

    def streamReader(self, schema) -> KafkaRangeStreamReader:
        return KafkaRangeStreamReader(SourceOptions.from_option(self.options["secret_config"]))


class KafkaRangeStreamReader(DataSourceStreamReader):
    def __init__(self, options: SourceOptions):
        self.options = options
        self._offsets: KafkaOffsets | None = None  # created lazily: executors never need it
        self._admission: Admission | None = None
        self._hints = PlannerHints()
        self._hints_read_at = 0.0

    def __getstate__(self) -> dict:
        return {"options": self.options}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["options"])

    # --- planning (driver side) ----------------------------------------------------------------
    def _kafka(self) -> KafkaOffsets:
        if self._offsets is None:
            # Only the streaming runner asks Kafka: the processes that create the source or plan
            # its read need no Kafka client.
            from sink_service.kafka_source.offsets import KafkaOffsets
            from sink_service.logs import WorkerLogging, configure_worker

            o = self.options
            if o.logging is not None:
                configure_worker(WorkerLogging(**{**o.logging, "secrets": tuple(o.logging["secrets"])}))
            self._offsets = KafkaOffsets(o.client_config, o.group_id)
            self._admission = Admission(
                Thresholds(records=o.flush_records, bytes=o.flush_bytes, interval_s=o.flush_interval_ms / 1000,
                           max_ranges_per_batch=o.max_files_per_batch, max_batch_records=o.max_batch_records,
                           first_batch_ranges=o.executor_cores)
            )
        return self._offsets

    def initialOffset(self) -> dict:
        return self.options.starting_positions

    def _read_hints(self) -> PlannerHints:
        """What the driver learned from finished ranges (sizes, column types); hints only."""
        now = time.monotonic()
        if now - self._hints_read_at > 1:
            self._hints_read_at = now
            self._hints = PlannerHints.load(Path(self.options.state_dir))
        return self._hints

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        kafka = self._kafka()
        current = flatten(start)
        available = kafka.latest(current)
        _check_log_ends(current, available)
        now = time.time()
        first_looks = self._admission.first_looks(current, available)
        written_at = self._written_at(kafka, first_looks, current, now) if first_looks else None
        end = self._admission.plan(current, available, now, self._read_hints().bytes_per_record, written_at)
        self._publish_pending(current, available, end)
        return nest(end)

    def _written_at(self, kafka: KafkaOffsets, tps: list[TP], start: dict[TP, int], now: float) -> dict[TP, float]:
        """When the first pending record of each of `tps` was written, where Kafka's timestamps say it was
        an interval ago or longer (then: an interval ago) or say exactly (the record at the position)."""
        from confluent_kafka import KafkaException

        interval_ms = self.options.flush_interval_ms
        due_ms = int(now * 1000) - interval_ms
        try:
            found = kafka.first_at_or_after(tps, due_ms)
        except KafkaException as exc:  # a hint only: the records are then dated by this look
            log.warning("could not read the timestamps of %d partition(s) to date their pending records (%s); "
                        "they wait SINK_FLUSH_INTERVAL_MS from now", len(tps), exc)
            return {}
        written_at: dict[TP, float] = {}
        for tp, (offset, timestamp) in found.items():
            if offset < 0 or offset > start[tp]:
                written_at[tp] = due_ms / 1000
            elif offset == start[tp]:
                written_at[tp] = timestamp / 1000
        return written_at

    def _publish_pending(self, start: dict, available: dict, end: dict) -> None:
        """What is still waiting after this plan, for the driver's metrics (another process)."""
        since = self._admission.pending_since
        state = {
            f"{topic}:{partition}": [max(0, available.get((topic, partition), 0) - end[(topic, partition)]),
                                     since.get((topic, partition))]
            for topic, partition in start
        }
        path = Path(self.options.state_dir) / PENDING_STATE_FILE
        tmp = path.with_suffix(".tmp")
        with contextlib.suppress(OSError):
            tmp.write_text(json.dumps({"partitions": state}))
            tmp.replace(path)

    def partitions(self, start: dict, end: dict) -> list[KafkaRangePartition]:
        """One range per admitted partition: its files are uploaded one at a time, in offset order,
        and a replay resumes at the first file not uploaded. Parallelism comes from partitions,
        dealt into one task per executor core."""
        begin, finish = flatten(start), flatten(end)
        types = self._read_hints().column_types
        ranges = [
            PlannedRange(Range(topic, partition, begin[(topic, partition)], stop), types.get(topic, ""))
            for (topic, partition), stop in sorted(finish.items())
            if (topic, partition) in begin and stop > begin[(topic, partition)]
        ]
        return bundle(ranges, self.options.executor_cores)

    def commit(self, end: dict) -> None:
        # Progress is committed to Kafka by the driver after upload, not here: Spark calls this
        # only when the *next* batch starts, which would hold back an idle partition's commit.
        pass

    # --- reading, decoding, writing, uploading (executor side) ------------------------------------
    def read(self, partition: KafkaRangePartition) -> Iterator[pa.RecordBatch]:
        """One outcome row per range, in the task's order: the records stay in this Python worker.

        Small ranges are fetched together (`range_reader.read_groups`) and then processed up to
        `RANGES_IN_FLIGHT` at a time, each in a thread of its own: a range of a few thousand records
        spends most of its time waiting for its upload (the endpoint's work), which other ranges'
        decoding and uploads now overlap. A batch holds one range per partition, so each partition's
        files are still uploaded one at a time, in offset order. A larger range is processed alone.
        """
        from concurrent.futures import ThreadPoolExecutor

        from sink_service.logs import configure_worker
        from sink_service.task.partition_task import process_range
        from sink_service.task.range_reader import consumer_config, read_groups
        from uploader.column_types import decode_schema

        o = self.options
        config = consumer_config(o.client_config, o.group_id)
        spec = o.task_spec()
        configure_worker(spec.logging)  # before any thread: once per worker process
        floors = {planned.range: planned.column_types for planned in partition.ranges}
        for group in read_groups([planned.range for planned in partition.ranges], config, o.read_batch_max_bytes):
            if len(group) == 1:
                [(rng, read)] = group
                yield process_range(spec, rng, read, decode_schema(floors[rng]))
                continue
            with ThreadPoolExecutor(min(RANGES_IN_FLIGHT, len(group)), thread_name_prefix="sink-range") as pool:
                outcomes = [pool.submit(process_range, spec, rng, read, decode_schema(floors[rng]))
                            for rng, read in group]
                for outcome in outcomes:
                    yield outcome.result()
        _freeze_worker_heap()


@functools.lru_cache(maxsize=2)
def _task_spec(packed: str) -> TaskSpec:
    """Built once per Python worker and query: Spark reuses a worker for later tasks, and the
    recipe of one query is the same string in all of them."""
    return pickle.loads(base64.b64decode(packed)).build()


_heap_frozen = False  # per Python worker process, which Spark reuses for later tasks


def _freeze_worker_heap() -> None:
    """Keep what a worker loaded for its first task out of every later garbage collection.

    Spark's daemon runs a full `gc.collect()` after every task of a reused Python worker. With
    pyarrow, PySpark and this package loaded that walks ~100k long-lived objects, about 30 ms a
    task, 40% of the workers' CPU at a live 20k records/s. After the first task (so lazily
    imported modules are in) they move to the permanent generation. Later collections still see
    every object created since, and refcounting frees frozen objects as usual.

    A flag says it is done: `gc.get_freeze_count()` counts the permanent generation object by
    object, 6-7 ms a task in a live run's workers (65k objects, a cold cache).
    """
    global _heap_frozen
    if not _heap_frozen:
        gc.collect()
        gc.freeze()
        _heap_frozen = True


def _check_log_ends(positions: dict[tuple[str, int], int], ends: dict[tuple[str, int], int]) -> None:
    """A log end below the position means truncation or a recreated topic: stop before it regrows.

    The query fails; the next one resolves its start from the committed offsets, where the gap
    is handled under SINK_RETENTION_GAP_POLICY.
    """
    behind = [f"topic={t} partition={p}: position {positions[(t, p)]} but the log ends at {end}"
              for (t, p), end in sorted(ends.items()) if end < positions[(t, p)]]
    if behind:
        raise OffsetGapError("the log end moved backwards: " + "; ".join(behind))
