"""Flush thresholds: when a partition's pending records become a file."""

from __future__ import annotations

from dataclasses import dataclass

from sink_service.config.declare import setting


@dataclass(frozen=True)
class FlushSettings:
    """Flush thresholds: part of `SinkConfig`."""

    # SINK_KAFKA_<NAME> pass-through is documented separately (see `kafka_passthrough`).

    flush_records: int = setting(
        "SINK_FLUSH_RECORDS", "A partition's pending data is written once it has this many records; "
        "also the most records one file holds.", 100_000, minimum=1, group="Flush")
    flush_bytes: int = setting(
        "SINK_FLUSH_BYTES", "A partition's pending data is written once its estimated Parquet size "
        "reaches this; files are capped at this size plus at most one row group.",
        64 * 1024 * 1024, minimum=1024, group="Flush")
    flush_interval_ms: int = setting(
        "SINK_FLUSH_INTERVAL_MS", "A partition's pending data is written once its oldest pending "
        "record has waited this long (wall clock, from the last look before it appeared, so a slow "
        "micro-batch does not add to it; records already in Kafka at the first look after a start are "
        "dated by their Kafka timestamps, so a backlog older than this is written at once), even while "
        "other partitions are busy. A micro-batch that "
        "runs for this reason also takes every partition whose data has waited half as long, so "
        "partitions flushed by time fall into step instead of each costing a micro-batch.",
        60_000, minimum=100, group="Flush")
    poll_interval_ms: int = setting(
        "SINK_POLL_INTERVAL_MS", "Micro-batch trigger interval: how often thresholds are checked.",
        1000, minimum=50, group="Flush")
    max_files_per_batch: int = setting(
        "SINK_MAX_FILES_PER_BATCH", "Most files' worth of records admitted into one micro-batch: a whole file "
        "counts one, a smaller range released by the time threshold its share of a file and at least a third (so 24 "
        "quiet partitions fit where 8 files would); bounds batch duration, time to the first commit and how much is "
        "replayed after a crash. Partitions that are behind count by SINK_MAX_BATCH_RECORDS instead.", 8, minimum=1,
        group="Flush")
    max_batch_records: int = setting(
        "SINK_MAX_BATCH_RECORDS", "Most records one micro-batch takes from partitions that are behind (records "
        "older than SINK_FLUSH_INTERVAL_MS when the partition was first looked at: a backlog at a start; or a "
        "wait of four intervals: a stall, an outage of the target), and at most SINK_MAX_FILES_PER_BATCH x "
        "SINK_FLUSH_BYTES of their estimated Parquet: a backlog is drained by volume, however small its files, "
        "while partitions that keep up are served in short batches of files. Bounds such a batch's duration and "
        "what a crash replays.",
        800_000, minimum=1, group="Flush")
