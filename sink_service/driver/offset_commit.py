"""Driver side: turn task outcomes into contiguous per-partition commits.

A partition is committed only up to the end of an unbroken run of finished ranges that starts
at its last commit. A range that failed, or one whose start does not line up with the previous
end, stops the run: nothing past it is committed, whatever happened to later ranges.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

TP = tuple[str, int]


@dataclass(frozen=True)
class RangeOutcome:
    topic: str
    partition: int
    range_start: int
    range_end: int
    committable: int  # every offset below this is uploaded or deliberately skipped
    status: str

    @property
    def tp(self) -> TP:
        return (self.topic, self.partition)


class ContiguousCommits:
    def __init__(self, positions: dict[TP, int]):
        # Where each partition's next range must start: its committed offset.
        self.positions = dict(positions)

    def advance(self, outcomes: Iterable[RangeOutcome]) -> tuple[dict[TP, int], list[str]]:
        """New commit positions, and a description of every range that broke contiguity."""
        by_tp: dict[TP, list[RangeOutcome]] = {}
        for outcome in outcomes:
            by_tp.setdefault(outcome.tp, []).append(outcome)
        commits: dict[TP, int] = {}
        gaps: list[str] = []
        for tp, ranges in by_tp.items():
            position = self.positions.get(tp)
            for rng in sorted(ranges, key=lambda r: r.range_start):
                if position is None:
                    position = rng.range_start  # partition discovered during this run
                if rng.range_start != position:
                    gaps.append(
                        f"topic={tp[0]} partition={tp[1]}: range starts at {rng.range_start} but "
                        f"everything is committed only up to {position}"
                    )
                    break
                if rng.committable > position:
                    position = rng.committable
                if rng.status != "ok" or rng.committable != rng.range_end:
                    break
            if position is not None and position != self.positions.get(tp):
                commits[tp] = position
                self.positions[tp] = position
        return commits, gaps
