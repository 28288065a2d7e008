"""Per topic-partition admission: decide which pending offsets the next micro-batch reads.

A partition's pending data is released when it reaches the record threshold, when its estimated
Parquet size reaches the byte threshold, or when its oldest pending record has waited longer
than the interval on the wall clock. Each partition is judged on its own, so an idle partition
is flushed on time even while others are busy.

A batch that runs because some partition is due by time also takes every partition whose oldest
pending record has waited at least half the interval: it would be due within half an interval
anyway. Without this, partitions whose timers drift apart (the first batch after a start holds
one wave; partitions that became active at different moments) keep their own phase for ever,
and every phase costs a micro-batch with its fixed planning and scheduling cost and its own small
files (measured at 20k records/s over 8 partitions: 22 micro-batches a minute, 13 with riders).
With riders, time-driven batches come at least half an interval apart, however many partitions
there are. The price, at high rates: one burst of files per interval instead of several smaller
ones, so the last file of a burst arrives later (80k records/s: p99 6.5 -> 8.4 s).

A batch's budget (`max_ranges_per_batch`) counts files: a whole file costs one, and a range smaller
than a file (the part time releases: a quiet partition, a busy one's tail) its share of a file and
at least `MIN_RANGE_COST`. Counted as one each, such ranges made batches of 8 out of 96 partitions
due by time, each partition waiting about 12 batches for its turn; a backlog's batches, made of
whole files, hold `SINK_MAX_FILES_PER_BATCH` files as before.

A partition that is behind is served by volume instead. Once its oldest pending record has waited
`BEHIND_INTERVALS` intervals (a stall, a target that was down), or from a first look that found records
written an interval ago or longer (a backlog at a start, a partition found with old records), its range costs
its records against `max_batch_records` (and its estimated Parquet bytes against the budget's files at
the byte threshold), not files: with a small record threshold every file of a backlog is small, and a
budget in files drained it eight small files a batch (1M records over 96 partitions in files of 10,840
records: 13 batches of 86k records, 30.8k records/s; by volume 38.4-39.8k). Partitions that keep
up are still served in short batches of files: every due range in one batch cost live latency (20k
records/s over 96 partitions: p99 12.1 s with 24 ranges a batch, 17.8 s with all 96).

Records already in Kafka when a partition is first looked at (a backlog after a start, a partition
found while running) are dated by their Kafka timestamps, not by that look: records written a minute
before a start have waited a minute. Without this, a backlog of partitions each holding less than a
file waited the whole interval after the start for nothing (1M records over 96 partitions: ~9 of 29
s). Only the first look: records that arrive later are dated by the looks, so a topic whose
timestamps are old (event times, a mirror) releases no more often than the interval.

Pure logic, no Kafka: unit-tested directly.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

TopicPartition = tuple[str, int]
# The least a range costs of the budget: a range has fixed costs (a file, an upload, an outcome row)
# whatever it holds. Live at 20k records/s over 96 partitions (28 Nov, two runs each; bench/README.md):
# 8 ranges a batch (a cost of one) p50 5.7 / p99 12.2 s at 14.6-15.1 CPU-s per M records, 24 (a third)
# 4.9-5.0 / 10.3-10.5 s at 13.9, 96 (every due range at once) 5.7-6.1 / 11.1-12.6 s at 13.2-13.5.
MIN_RANGE_COST = 1 / 3
# A partition whose oldest pending record has waited this many intervals is behind (see above). A live
# range waits one interval, plus its turn: at 20k records/s over 96 partitions with 24 ranges a batch,
# some waited two intervals, and counted as behind at two their batches grew to 74-88 ranges of 8-9 s
# (p99 12.1 -> 16.7 s). A stall or an outage of the target soon passes four.
BEHIND_INTERVALS = 4


@dataclass(frozen=True)
class Thresholds:
    records: int
    bytes: int
    interval_s: float
    max_ranges_per_batch: int  # in files' worth of records: a range may hold several, or a share of one
    max_batch_records: int  # the most records a batch takes from partitions that are behind
    # The first batch after a start holds one wave of files (one per core), so the first commit,
    # and readiness, come after seconds rather than after a whole backlog.
    first_batch_ranges: int | None = None


@dataclass
class Admission:
    thresholds: Thresholds
    # Per partition, (offset, time) checkpoints: the records below `offset` that an earlier
    # checkpoint does not cover arrived after `time`. The first checkpoint above the current
    # position dates the oldest pending record.
    arrivals: dict[TopicPartition, deque[tuple[int, float]]] = field(default_factory=dict)
    admitted_before: bool = False
    # New records are dated by the previous look, not this one: they may have waited since then,
    # and a look can come a whole micro-batch after the last. Dating them by this look would let
    # a partition wait the interval plus one micro-batch (or more, under load) before it is due.
    last_plan_at: float | None = None
    looked_at: set[TopicPartition] = field(default_factory=set)
    # Partitions whose first look found records written an interval ago or longer: behind until drained.
    # (Kafka's timestamps date them only that far back, `written_at`, so their wait alone would not say
    # they are behind until another interval had passed: 3 of a 96-partition backlog's 5 batches.)
    behind_since_first_look: set[TopicPartition] = field(default_factory=set)

    def first_looks(self, start: dict[TopicPartition, int],
                    available: dict[TopicPartition, int]) -> list[TopicPartition]:
        """Partitions with pending records that no look has seen: their records may have waited in Kafka."""
        return [tp for tp, begin in start.items() if tp not in self.looked_at and available.get(tp, begin) > begin]

    @property
    def pending_since(self) -> dict[TopicPartition, float]:
        """Since when, at the latest, each partition's oldest pending record has been waiting."""
        return {tp: seen[0][1] for tp, seen in self.arrivals.items() if seen}

    def _oldest_pending_since(self, tp: TopicPartition, position: int, available: int, new_since: float) -> float:
        seen = self.arrivals.setdefault(tp, deque())
        while seen and seen[0][0] <= position:
            seen.popleft()
        if not seen or seen[-1][0] < available:
            seen.append((available, new_since))
        return seen[0][1]

    def plan(
        self,
        start: dict[TopicPartition, int],
        available: dict[TopicPartition, int],
        now: float,
        bytes_per_record: dict[str, float] | None = None,
        written_at: Mapping[TopicPartition, float] | None = None,
    ) -> dict[TopicPartition, int]:
        """End offsets for the next batch; a partition not admitted keeps its start offset.

        `written_at`: for partitions of `first_looks`, when (wall clock, at the latest) the first
        pending record was written to Kafka.
        """
        limits = self.thresholds
        estimates = bytes_per_record or {}
        # (since, partition, records due by a threshold, records pending), oldest first
        candidates: list[tuple[float, TopicPartition, int, int]] = []
        file_records: dict[TopicPartition, int] = {}  # a file's worth of records, by the byte estimate
        new_since = now if self.last_plan_at is None else self.last_plan_at
        rider_age = limits.interval_s / 2
        written_at = written_at or {}
        for tp, begin in start.items():
            first_look = tp not in self.looked_at
            self.looked_at.add(tp)
            pending = available.get(tp, begin) - begin
            if pending <= 0:
                self.arrivals.pop(tp, None)
                self.behind_since_first_look.discard(tp)
                continue
            dated = min(new_since, written_at.get(tp, new_since)) if first_look else new_since
            if first_look and now - dated >= limits.interval_s:
                self.behind_since_first_look.add(tp)
            since = self._oldest_pending_since(tp, begin, available[tp], dated)
            records_per_file = limits.records
            estimate = estimates.get(tp[0])
            if estimate:
                records_per_file = max(1, min(records_per_file, int(limits.bytes / estimate)))
            file_records[tp] = records_per_file
            timed_out = now - since >= limits.interval_s
            # By count or size only whole files are admitted; by time, everything pending.
            admit = pending if timed_out else (pending // records_per_file) * records_per_file
            if admit > 0 or now - since >= rider_age:
                candidates.append((since, tp, admit, pending))

        self.last_plan_at = now
        timed_batch = any(now - since >= limits.interval_s for since, *_ in candidates)
        # Oldest first; at equal age (everything pending at a start is dated by its first look) the
        # largest backlog first, so a service that crashes after each first batch still serves every
        # partition in turn rather than the lowest-numbered ones forever.
        ranked = sorted(candidates, key=lambda c: (c[0], -c[3], c[1]))
        due = [(since, tp, pending if timed_batch and now - since >= rider_age else admit)
               for since, tp, admit, pending in ranked]
        due = [entry for entry in due if entry[2] > 0]
        end = dict(start)
        # Oldest pending data first; every due partition gets one file's worth before any gets two.
        budget: float = limits.max_ranges_per_batch
        least_cost = MIN_RANGE_COST
        if not self.admitted_before and limits.first_batch_ranges:
            # One wave: a range per core, whatever it holds, so the first commit comes after one task each.
            budget, least_cost = min(budget, limits.first_batch_ranges), 1.0
        grants = {tp: 0 for _, tp, _ in due}
        behind = set()
        if self.admitted_before:
            behind = {tp for since, tp, _ in due
                      if tp in self.behind_since_first_look or now - since >= BEHIND_INTERVALS * limits.interval_s}
        while budget > 0:
            progressed = False
            for _, tp, admit in due:
                if grants[tp] < admit:
                    per_file = file_records[tp]
                    if tp in behind:
                        # A file at a time, costing its share of the records budget or of the files' bytes.
                        step = min(admit - grants[tp], per_file)
                        cost = max(limits.max_ranges_per_batch * step / limits.max_batch_records,
                                   step * estimates.get(tp[0], 0.0) / limits.bytes)
                    else:
                        step = min(admit - grants[tp], limits.records)
                        cost = 1.0 if step >= per_file else max(least_cost, step / per_file)
                    if cost > budget + 1e-9 and any(grants.values()):
                        continue  # the first range always fits: a budget below one file still moves
                    grants[tp] += step
                    budget -= cost
                    progressed = True
            if not progressed:
                break
        for tp, granted in grants.items():
            if granted > 0:
                self.admitted_before = True
                end[tp] = start[tp] + granted
                if end[tp] >= available[tp]:
                    self.arrivals.pop(tp, None)
                    self.behind_since_first_look.discard(tp)
        return end
