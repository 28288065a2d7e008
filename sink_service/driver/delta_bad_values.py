"""Records whose value the Delta table's column cannot take, handled under SINK_ERROR_POLICY by the driver.

For a Delta target the table is what types a topic's rows, so only the driver's merge can find such a
record (text in a number column the table may not widen: `SINK_DELTA_WIDEN_TO_STRING=false`). The merge
leaves it out and hands it here before it commits (uploader.delta.BadValue), so one dirty value costs its
record, not its file:
- `skip`: a WARNING naming the record (topic, partition, offset, column, value), counted in
  `sink_bad_records_total{reason="table_type"}`;
- `dlq`: the record is read again from Kafka and produced unchanged to SINK_DLQ_TOPIC, with the same
  `sink.*` headers as any dead letter, and acknowledged before the merge commits (a failure fails the merge;
  the batch's replay repeats it);
- `fail`: the merge stops naming the record; nothing of the batch is applied and the service exits 3.
A merge retried after a conflict hands the same records again: each is said and dead-lettered once per batch.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Mapping

from sink_service.decode.bad_records import BadRecord
from sink_service.driver.metrics import SinkMetrics
from sink_service.shared.kafka_access import KafkaAccessRefused
from sink_service.task.dead_letters import DeadLetterError, DeadLetterRefused, DeadLetters, DeadLetterSpec
from sink_service.task.range_reader import read_range
from sink_service.task.ranges import Range
from uploader.delta import BadValue
from uploader.errors import FatalUploadError, RetryableUploadError

log = logging.getLogger(__name__)

KIND = "table_type"  # sink_bad_records_total{reason}, the dead letter's sink.error.kind


class DeltaBadValues:
    """The `on_bad_values` of the driver's merges (uploader.delta.DeltaTarget.merge)."""

    def __init__(self, policy: str, metrics: SinkMetrics, dead_letters: DeadLetterSpec | None = None,
                 read_config: Mapping[str, object] | None = None, read_batch_max_bytes: int = 16 * 1024 * 1024) -> None:
        if policy == "dlq" and (dead_letters is None or read_config is None):
            raise ValueError("SINK_ERROR_POLICY=dlq needs the dead-letter topic and a Kafka read configuration")
        self.policy = policy
        self.metrics = metrics
        self.dead_letters = dead_letters
        self.read_config = read_config
        self.read_batch_max_bytes = read_batch_max_bytes
        self._handled: set[tuple[str, int, int]] = set()  # this batch's, across the merge's attempts

    def new_batch(self) -> None:
        self._handled.clear()

    def __call__(self, values: list[BadValue]) -> None:
        fresh: dict[tuple[str, int, int], BadValue] = {}
        for value in values:
            where = (value.topic, value.partition, value.offset)
            if where not in self._handled:
                fresh.setdefault(where, value)
        if not fresh:
            return
        if self.policy == "fail":
            first = next(iter(fresh.values()))
            raise FatalUploadError(
                f"bad record {first.describe()} (SINK_ERROR_POLICY=fail; {len(fresh)} such record(s) in this "
                "batch). Nothing of the batch was applied. Fix the producer, or set SINK_ERROR_POLICY=skip or "
                f"dlq to leave such records out, or SINK_DELTA_WIDEN_TO_STRING=true to store the column as text.",
                reason="bad_record", setting="SINK_ERROR_POLICY")
        if self.policy == "dlq":
            self._dead_letter(list(fresh.values()))
        for value in fresh.values():
            log.warning("bad record %s (SINK_ERROR_POLICY=%s: %s)", value.describe(), self.policy,
                        "sent to the dead-letter topic" if self.policy == "dlq" else "left out of the table",
                        extra={"fields": {"event": "bad_record", "topic": value.topic, "partition": value.partition,
                                          "offset": value.offset, "reason": KIND, "column": value.column}})
            self.metrics.bad_records.labels(value.topic, KIND).inc()
        self._handled.update(fresh)

    def _dead_letter(self, values: list[BadValue]) -> None:
        """Each record read again at its offset and produced unchanged; all acknowledged before returning."""
        assert self.dead_letters is not None and self.read_config is not None
        partitions: dict[tuple[str, int], list[BadValue]] = defaultdict(list)
        for value in values:
            partitions[(value.topic, value.partition)].append(value)
        try:
            for of_partition in partitions.values():  # DeadLetters keeps one partition's offsets
                letters = DeadLetters(self.dead_letters)
                for value in of_partition:
                    rng = Range(value.topic, value.partition, value.offset, value.offset + 1)
                    bad = [BadRecord(value.topic, value.partition, value.offset, value.describe(), KIND)]
                    for raw in read_range(rng, self.read_config, self.read_batch_max_bytes):
                        letters.send(raw, bad)
                letters.settle(max(v.offset for v in of_partition) + 1)
        except (DeadLetterRefused, KafkaAccessRefused) as exc:
            raise FatalUploadError(f"dead-lettering bad records of the Delta merge: {exc}. Fix SINK_DLQ_TOPIC as "
                                   "said and restart.", reason="dead_letter", setting="SINK_DLQ_TOPIC") from exc
        except DeadLetterError as exc:
            raise RetryableUploadError(f"dead-lettering bad records of the Delta merge: {exc}",
                                       reason="dead_letter") from exc
