"""The driver's part of a target in every micro-batch: tasks write or stage files, the driver finishes the batch.

One interface for every target, so the pipeline never asks which target it serves:
- EMS, S3 and a directory (`UploadsFinal`): a task's upload is the end of a file's way; the driver has
  nothing to add before Kafka's commit.
- Delta (`DeltaBatches`): tasks stage files beside the table; `apply` merges those the batch's commit
  positions cover into each table in one commit, before Kafka's commit, and `release` deletes them after it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from sink_service.driver.offset_commit import TP

if TYPE_CHECKING:
    from sink_service.config import SinkConfig
    from sink_service.driver.metrics import SinkMetrics
    from sink_service.task.recipe import TaskRecipe


class BatchCommit(Protocol):
    # What `apply` does, for the messages of a failed batch ("merging into the Delta table").
    action: str

    def resume_position(self, topic: str, partition: int) -> int | None:
        """Where a partition without a committed offset resumes, if the target itself knows (a Delta table's
        transactions for the group); None: it starts at SINK_STARTING_OFFSETS like a new group."""

    def start(self, positions: dict[TP, int]) -> threading.Thread | None:
        """A query starts at `positions`: clear what a crashed batch left, in the background (the thread)."""

    def apply(self, rows: Iterable, commits: dict[TP, int]) -> list:
        """Before Kafka's commit: make the batch's files below the new `commits` positions visible; returns what
        `release` frees. Raises RetryableUploadError (the batch is replayed) or FatalUploadError (stop)."""

    def release(self, applied: list, commits: dict[TP, int]) -> None:
        """After Kafka's commit: free what `apply` used (staged files)."""

    def close(self, timeout_s: float) -> None:
        """At shutdown, after the query stopped: background work ends within `timeout_s`."""


class UploadsFinal:
    """EMS, S3, a directory: each task's upload already applied its file; the batch needs nothing more."""

    action = "finishing the batch"

    def resume_position(self, topic: str, partition: int) -> int | None:
        return None

    def start(self, positions: dict[TP, int]) -> None:
        return None

    def apply(self, rows: Iterable, commits: dict[TP, int]) -> list:
        return []

    def release(self, applied: list, commits: dict[TP, int]) -> None:
        pass

    def close(self, timeout_s: float) -> None:
        pass


def batch_commit(config: SinkConfig, metrics: SinkMetrics, recipe: TaskRecipe,
                 client_config: dict[str, str]) -> BatchCommit:
    """The driver's part of `config`'s target (deltalake and pyarrow are imported for a Delta target only)."""
    if config.target != "delta":
        return UploadsFinal()
    from sink_service.config.upload_targets import target_settings
    from sink_service.driver.delta_bad_values import DeltaBadValues
    from sink_service.driver.delta_batches import DeltaBatches
    from sink_service.task.range_reader import consumer_config
    from uploader.parking import ParkingSettings

    settings = target_settings(config)
    parked = None
    if isinstance(settings, ParkingSettings):
        settings, parked = settings.inner, settings.parked
    bad_values = DeltaBadValues(config.error_policy, metrics, recipe.dead_letters(),
                                consumer_config(client_config, config.group_id), config.read_batch_max_bytes)
    return DeltaBatches(settings, parked, Path(config.scratch_dir), config.delta_merge_max_bytes, metrics, bad_values)
