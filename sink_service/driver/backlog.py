"""While a backlog drains, one INFO line every 30 s: records left and when it should be caught up.

An operator who restarts a group from Tuesday 14:00, or brings the service back after an outage,
asks "how long?". Lag alone does not answer it; the rate does. The rate is measured from the
group's committed offsets (what was really uploaded and committed) and the log ends (what arrived
meanwhile) over the last two report intervals, so one slow or one lucky micro-batch does not swing
the estimate; the time left is the records left over the net rate at which lag falls.

A partition is caught up while its lag is at most one file's worth (SINK_FLUSH_RECORDS): that much
may wait for a flush threshold in normal running, and must not read as a backlog. No line is logged
while every partition is caught up; a backlog that appears again is first reported after a whole
interval, so that its rate is measured, not guessed.

Pure logic, no Kafka: the driver feeds it the offsets it reads for the lag metrics anyway.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

TP = tuple[str, int]
REPORT_INTERVAL_S = 30.0
RATE_WINDOW_INTERVALS = 2

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BacklogReport:
    records_left: int
    partitions: int  # partitions behind by more than a file's worth
    committed_per_s: float
    arriving_per_s: float
    window_s: float

    @property
    def eta_s(self) -> float | None:
        """Seconds until caught up at the current net rate; None while lag does not fall."""
        net = self.committed_per_s - self.arriving_per_s
        return self.records_left / net if net > 0 else None

    def line(self) -> str:
        eta = self.eta_s
        rates = (f"committing {self.committed_per_s:,.0f}/s while {self.arriving_per_s:,.0f}/s arrive "
                 f"(last {self.window_s:.0f}s)")
        outlook = f"caught up in about {_duration(eta)}" if eta is not None else "not catching up"
        return f"backlog: {self.records_left:,} record(s) left in {self.partitions} partition(s); {rates}: {outlook}"

    def fields(self) -> dict[str, object]:
        eta = self.eta_s
        return {"event": "backlog", "records_left": self.records_left, "partitions": self.partitions,
                "committed_per_s": round(self.committed_per_s, 1), "arriving_per_s": round(self.arriving_per_s, 1),
                "eta_s": round(eta, 1) if eta is not None else None}


@dataclass
class _Sample:
    at: float
    committed: dict[TP, int]
    end: dict[TP, int]


@dataclass
class BacklogProgress:
    """Fed every few seconds; answers a report at most once per interval while a backlog drains."""

    caught_up_records: int  # per partition: SINK_FLUSH_RECORDS
    interval_s: float = REPORT_INTERVAL_S
    _samples: deque[_Sample] = field(default_factory=deque)
    _last_report_at: float | None = None
    # The offset monitor and a query's start both refresh the lag: one observation at a time.
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def observe(self, now: float, committed: Mapping[TP, int], end: Mapping[TP, int]) -> BacklogReport | None:
        """`committed` per partition (its resolved start where nothing is committed yet), `end` its log end."""
        lag = {tp: max(0, high - committed[tp]) for tp, high in end.items() if tp in committed}
        behind = [tp for tp, left in lag.items() if left > self.caught_up_records]
        if not behind:
            self._samples.clear()  # caught up: a later backlog is measured from its own start
            self._last_report_at = None
            return None
        self._samples.append(_Sample(now, dict(committed), dict(end)))
        while len(self._samples) > 1 and now - self._samples[1].at >= self.interval_s * RATE_WINDOW_INTERVALS:
            self._samples.popleft()
        oldest = self._samples[0]
        since = self._last_report_at if self._last_report_at is not None else oldest.at
        if now - since < self.interval_s or now - oldest.at < self.interval_s:
            return None
        self._last_report_at = now
        window = now - oldest.at
        common = [tp for tp in lag if tp in oldest.committed and tp in oldest.end]
        # A committed offset moved back (an offset reset) is not negative progress: it counts as none.
        done = sum(max(0, committed[tp] - oldest.committed[tp]) for tp in common)
        arrived = sum(max(0, end[tp] - oldest.end[tp]) for tp in common)
        return BacklogReport(sum(lag.values()), len(behind), done / window, arrived / window, window)

    def report(self, now: float, committed: Mapping[TP, int], end: Mapping[TP, int]) -> None:
        """`observe`, and log the line when there is one."""
        with self._lock:
            found = self.observe(now, committed, end)
        if found is not None:
            log.info("%s", found.line(), extra={"fields": found.fields()})


def _duration(seconds: float) -> str:
    total = round(seconds)
    if total < 60:
        return f"{total}s"
    if total < 3600:
        return f"{total // 60}m {total % 60:02d}s"
    return f"{total // 3600}h {total % 3600 // 60:02d}m"
