"""Clients the range reader and the dead-letter producer cache per process, closed so none outlives a test's broker."""

from __future__ import annotations

from sink_service.task import dead_letters, range_reader


def close_cached_clients() -> None:
    for consumer in range_reader._consumers.values():
        consumer.close()
    range_reader._consumers.clear()
    range_reader._access.clear()
    for producer in dead_letters._producers.values():
        producer.flush(5)
    dead_letters._producers.clear()
    dead_letters._access.clear()
