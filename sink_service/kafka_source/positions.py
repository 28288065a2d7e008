"""Positions as Spark carries them, and the error for a position outside its partition's log.

Spark's offsets are JSON (`{"topic": {"0": 42}}`); the code works on `{("topic", 0): 42}`. Kept
apart from `offsets`, which talks to Kafka: Spark's planning processes that only unpickle the source
(creating it, planning its read) then load no Kafka client (~25 ms each before the first batch).
"""

from __future__ import annotations

from collections.abc import Mapping

TP = tuple[str, int]


class OffsetGapError(Exception):
    """A committed offset lies outside the partition's log: deleted by retention, or beyond its end.

    Beyond the end happens when the log was truncated (unclean leader election) or the topic was
    deleted and recreated under the same name: once the new log grows past the old position, the
    offsets in between would be skipped without a word.
    """


def flatten(nested: Mapping[str, Mapping[str, int]]) -> dict[TP, int]:
    """Spark offsets are JSON: {"topic": {"0": 42}}; code works on {(topic, 0): 42}."""
    return {(topic, int(p)): int(o) for topic, parts in nested.items() for p, o in parts.items()}


def nest(flat: Mapping[TP, int]) -> dict[str, dict[str, int]]:
    nested: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(flat.items()):
        nested.setdefault(topic, {})[str(partition)] = offset
    return nested
