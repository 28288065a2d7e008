"""Table maintenance for the Delta target: compaction, log cleanup and vacuum, never at an upload's expense.

Where it runs. In the writer whose merge commit lands on a version that is a multiple of
`SINK_DELTA_COMPACT_EVERY_COMMITS` (vacuum: of `SINK_DELTA_VACUUM_EVERY_COMMITS`), right after that
merge: the service's driver after a micro-batch's merge, or the `uploader push` CLI. Merges commit with
`max_commit_retries=0`, so every table version is written by exactly one writer: across all instances of
a group (and other groups writing the same table) exactly one of them owns each multiple, with no
coordination, no timer and no extra state. The price: that one batch takes the maintenance's time
(measured in bench notes of the report: ~0.1-0.5 s for 100 small files).

Safety.
- Maintenance runs only after the file's merge committed; its outcome is returned, logged and counted
  (receipt.details["maintenance"]), and any error is swallowed: it never fails, retries or repeats an
  upload. A compaction that loses to a concurrent merge (delta-rs's conflict checker refuses it) is
  skipped and done at the next multiple; a merge that loses to a compaction is the ordinary retried
  `delta_conflict`, which re-reads the table and its application transactions.
- Compaction (`optimize.compact`) rewrites files with `dataChange=false` and leaves the log's
  application transactions alone: `transaction_version(app_id)` is the same before and after (tested).
- Log checkpoints: delta-rs writes one after every `delta.checkpointInterval` commits in the commit's
  post-commit hook, for our merges too (they keep the default hook): 10 in the tables the service creates
  (uploader.delta.TABLE_PROPERTIES: each look at a table replays the log since the checkpoint), delta-rs's
  default 100 in tables created before; with
  `delta.enableExpiredLogCleanup` (default true) it then removes log entries older than
  `delta.logRetentionDuration` (default 30 days). Maintenance calls `cleanup_metadata()` too, for tables
  whose commits came from writers without the hook. Checkpoints carry the application transactions.
- Vacuum deletes only files removed from the table more than the retention ago, and files no commit
  references (the data files of a merge or widening that lost its commit race or died before
  committing: commits use `max_commit_retries=0`, so a lost race leaves its files behind) once they are
  older than the retention: delta-rs's `full` vacuum, which lists the table's whole directory or prefix.
  The retention is the longer of `SINK_DELTA_VACUUM_RETENTION_HOURS` (default 168, the config refuses
  < 24) and the table's own `delta.deletedFileRetentionDuration`, so a reader holding a snapshot that
  old keeps working, and a merge still writing its files (minutes old) keeps them. `_`- and
  `.`-prefixed directories (`_delta_log`, `_sink_staging`) are never vacuumed (delta-rs, tested).
- The scratch directories (`.delta-widen-*`) a widening that crashed left beside a directory table's
  staged files are removed in each round once untouched for WIDEN_LEFTOVER_AGE_S
  (uploader.delta_staging, which removes them at a query's start too).
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

from deltalake import CommitProperties, DeltaTable

from uploader.delta_settings import DeltaSettings
from uploader.delta_staging import remove_widen_leftovers

log = logging.getLogger(__name__)

META_MAINTENANCE = "kafka_parquet_sink.maintenance"
_INTERVAL = re.compile(r"^\s*interval\s+(\d+)\s+(\w+?)s?\s*$", re.IGNORECASE)
_UNIT_HOURS = {"second": 1 / 3600, "minute": 1 / 60, "hour": 1.0, "day": 24.0, "week": 168.0}


def due(version: int, every: int) -> bool:
    """Whether the writer of `version` owns this round (0 disables)."""
    return every > 0 and version > 0 and version % every == 0


def maintain(table: DeltaTable, settings: DeltaSettings, merged_version: int) -> dict[str, Any]:
    """The maintenance owned by the writer of `merged_version`; never raises.

    Returns what ran, for the receipt: {"compact": {...} | "skipped: ...", "vacuum": ..., "seconds": s}."""
    compact = due(merged_version, settings.compact_every_commits)
    vacuum = due(merged_version, settings.vacuum_every_commits) and settings.vacuum_retention_hours > 0
    if not (compact or vacuum):
        return {}
    report: dict[str, Any] = {"at_version": merged_version}
    started = time.monotonic()
    if compact:
        report["compact"] = _guarded("compaction", table, lambda: _compact(table, merged_version))
        report["cleanup_metadata"] = _guarded("log cleanup", table, lambda: table.cleanup_metadata() or "done")
    if vacuum:
        report["vacuum"] = _guarded("vacuum", table, lambda: _vacuum(table, settings, merged_version))
    if table.table_uri.startswith("file://"):
        root = table.table_uri  # a directory table: its staging directories hold the widenings' scratch
        report["widen_leftovers"] = _guarded("scratch cleanup", table, lambda: remove_widen_leftovers(root))
    report["seconds"] = round(time.monotonic() - started, 3)
    report["failed"] = sorted(k for k, v in report.items() if isinstance(v, str) and v.startswith("failed"))
    log.info("delta maintenance of %s after version %d: %s", table.table_uri, merged_version, report)
    return report


def retention_hours(table: DeltaTable, settings: DeltaSettings) -> int:
    """The longer of the setting and the table's own `delta.deletedFileRetentionDuration`."""
    configured = table.metadata().configuration.get("delta.deletedFileRetentionDuration")
    table_hours = _hours(configured) if configured else 0.0
    return max(settings.vacuum_retention_hours, int(-(-table_hours // 1)))


def _compact(table: DeltaTable, version: int) -> dict[str, Any]:
    table.update_incremental()
    metrics = table.optimize.compact(commit_properties=CommitProperties(
        custom_metadata={META_MAINTENANCE: f"compact after version {version}"}))
    return {k: metrics[k] for k in ("numFilesAdded", "numFilesRemoved", "totalConsideredFiles") if k in metrics}


def _vacuum(table: DeltaTable, settings: DeltaSettings, version: int) -> dict[str, Any]:
    table.update_incremental()
    hours = retention_hours(table, settings)
    deleted = table.vacuum(retention_hours=hours, dry_run=False, enforce_retention_duration=False, full=True,
                           commit_properties=CommitProperties(
                               custom_metadata={META_MAINTENANCE: f"vacuum after version {version}"}))
    return {"deleted_files": len(deleted), "retention_hours": hours}


def _guarded(what: str, table: DeltaTable, run: Any) -> Any:
    """One maintenance step; a failure (a conflict with a concurrent merge, a store error) is logged
    and reported, and waits for the next round."""
    try:
        return run()
    except Exception as exc:  # deltalake raises its own errors and plain OSError/ValueError from Rust
        detail = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        log.warning("delta %s of %s skipped, retried at the next round: %s", what, table.table_uri, detail)
        return f"failed: {detail}"


def _hours(interval: str) -> float:
    """`interval 7 days` (Delta's table-property syntax) in hours; 0 when unreadable."""
    match = _INTERVAL.match(interval)
    if not match:
        return 0.0
    return int(match.group(1)) * _UNIT_HOURS.get(match.group(2).lower(), 0.0)
