"""An offset range of one topic-partition: what the planner hands a task to read."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Range:
    topic: str
    partition: int
    start: int
    end: int  # exclusive

    @property
    def records(self) -> int:
        return self.end - self.start
