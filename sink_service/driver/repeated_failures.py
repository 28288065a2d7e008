"""Driver side: notice a partition that fails again and again at the same place.

A range that fails while writing is read again record by record, so a bad record becomes a bad
record under the error policy. What still fails after that is unexplained: it is replayed, but
replaying the same offset into the same error forever would stall the partition without end.
Upload and read failures are outages, not counted here: the service waits those out.
Pure logic, no Spark or Kafka: unit-tested directly.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sink_service.driver.offset_commit import TP


@dataclass(frozen=True)
class Failure:
    """One range that stopped early: where, and why."""

    topic: str
    partition: int
    offset: int  # the first offset not handled
    error: str
    counts: bool  # False for outages (upload, read), which are retried without a limit

    @property
    def tp(self) -> TP:
        return (self.topic, self.partition)


@dataclass(frozen=True)
class Streak:
    failure: Failure
    times: int

    def describe(self) -> str:
        f = self.failure
        return (f"topic={f.topic} partition={f.partition} offset={f.offset} failed {self.times} time(s) in a "
                f"row with the same error: {f.error}")


class RepeatedFailures:
    def __init__(self, limit: int):
        self.limit = limit
        self._streaks: dict[TP, Streak] = {}

    def observe(self, finished: Iterable[TP], failures: Iterable[Failure]) -> list[Streak]:
        """Record one micro-batch; returns the partitions whose streak reached the limit.

        A partition that finished a range, or failed somewhere else or differently, starts over.
        """
        for tp in finished:
            self._streaks.pop(tp, None)
        for failure in failures:
            if not failure.counts:
                self._streaks.pop(failure.tp, None)
                continue
            previous = self._streaks.get(failure.tp)
            times = previous.times + 1 if previous is not None and previous.failure == failure else 1
            self._streaks[failure.tp] = Streak(failure, times)
        return [s for s in self._streaks.values() if s.times >= self.limit]

    @property
    def streaks(self) -> dict[TP, Streak]:
        return dict(self._streaks)
