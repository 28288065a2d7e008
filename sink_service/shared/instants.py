"""Points in time as operators write them (ISO-8601 with a UTC offset) and as Kafka keeps them (ms).

Shared by the configuration check of `SINK_STARTING_OFFSETS`, the start-position lookup and
`sink-service offsets --to-timestamp`, so all three accept and refuse the same texts.
"""

from __future__ import annotations

import datetime

TIMESTAMP_PREFIX = "timestamp:"


def parse_instant(text: str) -> datetime.datetime:
    """An ISO-8601 time with its UTC offset (`2026-11-24T14:00:00Z`, `...+01:00`).

    A time without an offset is refused rather than read as local or UTC: the container's time
    zone is rarely the operator's, and a guess moves the start by hours without a word.
    """
    try:
        when = datetime.datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"{text!r} is not an ISO-8601 time, e.g. 2026-11-24T14:00:00Z") from None
    if when.tzinfo is None or when.utcoffset() is None:
        raise ValueError(f"{text!r} has no UTC offset; add Z or +HH:MM, e.g. 2026-11-24T14:00:00Z")
    return when


def epoch_ms(when: datetime.datetime) -> int:
    """Kafka record timestamps are milliseconds since the epoch."""
    return int(when.timestamp() * 1000)


def starting_time_ms(starting: str) -> int | None:
    """The time of a `timestamp:<ISO-8601>` starting position, in Kafka's milliseconds; None for
    `earliest`/`latest`. Raises ValueError naming the problem for a malformed value."""
    if starting in ("earliest", "latest"):
        return None
    if not starting.startswith(TIMESTAMP_PREFIX):
        raise ValueError(f"must be earliest, latest or timestamp:<ISO-8601 time with offset>; got {starting!r}")
    return epoch_ms(parse_instant(starting[len(TIMESTAMP_PREFIX):]))


def iso_ms(ms: int) -> str:
    """A Kafka timestamp as UTC ISO-8601, for log lines and tables."""
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")
