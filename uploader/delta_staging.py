"""Staging beside a Delta table: tasks put their closed files here, the driver merges a micro-batch's files
in one commit (sink_service.driver.delta_batches) and deletes them.

A staged file lives at `<table>/_sink_staging/<group>/<topic>/<partition>/<first:020d>-<last:020d>.parquet`,
written by the directory or S3 target (atomic; a replay of the same range overwrites the same name). Delta
readers and vacuum leave `_`-prefixed directories alone. The table's store is used, not the driver's disk,
so executors on other machines reach it too. Nothing staged is needed after a crash: the offsets are not
committed before the merge, so a replay stages the range again; staged files the table already covers are
deleted after each batch's commit and, for leftovers of failed batches, when a query starts.

A delete that fails (S3's DeleteObjects answers per key: AccessDenied when the credentials may not delete
under the table) is logged at WARNING, naming what to grant, and counted by reason
(`sink_delta_staging_delete_failures_total`, read from `delete_failures()`); it never fails a batch: the
rows are in the table and the offsets in Kafka, the next start tries again.

A widening of a directory table converts the table's rows into a `.delta-widen-*` scratch directory beside
the merged files, i.e. in a partition's staging directory (uploader.delta). A crash leaves it there: the
partition's listing at a query's start and each maintenance round remove the ones untouched for
WIDEN_LEFTOVER_AGE_S (a live widening writes its scratch file continuously, then reads it back once).
"""

from __future__ import annotations

import logging
import pathlib
import shutil
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Self
from urllib.parse import quote, unquote, urlsplit

from uploader.delta_settings import S3_SCHEME, DeltaSettings
from uploader.delta_storage import s3_settings_at
from uploader.directory import DirectorySettings, DirectoryTarget, is_temp_name
from uploader.retry import OnRetry
from uploader.target import FileMetadata, Receipt

log = logging.getLogger(__name__)

STAGING_DIR = "_sink_staging"
WIDEN_SCRATCH_PREFIX = ".delta-widen-"  # uploader.delta's tempfile prefix for a widening's converted rows
WIDEN_LEFTOVER_AGE_S = 6 * 3600
DELETE_PERMISSION_HINT = ("grant s3:DeleteObject on the table's prefix: the service deletes staged files after "
                          "each merge and vacuum deletes the table's unreferenced files")
_delete_failures: Counter[str] = Counter()  # reason -> staged files not deleted, since the process started
_delete_failures_lock = threading.Lock()


def delete_failures() -> dict[str, int]:
    """Staged files that could not be deleted since the process started, by reason (an S3 error code such
    as AccessDenied, or an OSError class); the driver's metrics read it at each scrape."""
    with _delete_failures_lock:
        return dict(_delete_failures)


def remove_widen_leftovers(table: str, older_than_s: float = WIDEN_LEFTOVER_AGE_S) -> int:
    """Remove the `.delta-widen-*` scratch directories under a directory table's staging area (`table`: its
    path or file:// URI) that nothing touched for `older_than_s`; how many. Nothing for an s3:// table (a
    widening's scratch is on the driver's disk then, removed after each merge)."""
    if table.startswith(S3_SCHEME):
        return 0
    root = pathlib.Path(unquote(urlsplit(table).path) if table.startswith("file://") else table)
    return _remove_stale(root.glob(f"{STAGING_DIR}/*/*/*/{WIDEN_SCRATCH_PREFIX}*"), older_than_s)


def _remove_stale(directories: Any, older_than_s: float) -> int:
    removed = 0
    for directory in directories:
        try:
            touched = max((p.stat().st_mtime for p in (directory, *directory.rglob("*"))), default=0.0)
        except FileNotFoundError:  # removed meanwhile (its widening ended)
            continue
        if time.time() - touched < older_than_s:
            continue
        shutil.rmtree(directory, ignore_errors=True)
        removed += 1
        log.warning("removed %s, the scratch of a Delta widening that did not finish (untouched for %.1f h)",
                    directory, (time.time() - touched) / 3600)
    return removed


@dataclass(frozen=True)
class DeltaStagingSettings:
    """What a task is told for a Delta target: stage, do not merge. Hashable and picklable."""

    delta: DeltaSettings


@dataclass(frozen=True)
class StagedFile:
    """A staged file as found by listing: where it is and the offsets its name says it holds."""

    location: str
    first_offset: int
    last_offset: int


class StagingArea:
    """The staged files of one table and group."""

    def __init__(self, settings: DeltaSettings, topic: str) -> None:
        self.root = f"{settings.uri_for(topic).rstrip('/')}/{STAGING_DIR}/{quote(settings.group_id, safe='')}"
        self._s3: Any = None
        if self.root.startswith(S3_SCHEME):
            from uploader.s3 import S3Target  # boto3 only for tables on S3

            self._s3 = S3Target(s3_settings_at(settings, self.root))
            self._target: Any = self._s3
        else:
            self._target = DirectoryTarget(DirectorySettings(path=self.root, retry=settings.retry))

    def stage(self, path: pathlib.Path, metadata: FileMetadata, on_retry: OnRetry | None = None) -> Receipt:
        return self._target.upload(path, metadata, on_retry)

    def local_copy(self, location: str, scratch: pathlib.Path) -> pathlib.Path:
        """A path the driver can read the staged file at: itself in a directory, a download from S3.
        FileNotFoundError when it is gone (another member merged and deleted it)."""
        if self._s3 is None:
            return pathlib.Path(location)
        scratch.mkdir(parents=True, exist_ok=True)
        destination = scratch / self._key(location).replace("/", "_")
        if not self._s3.download(self._key(location), destination):
            raise FileNotFoundError(f"staged file {location} is gone")
        return destination

    def delete(self, locations: list[str]) -> dict[str, str]:
        """Delete staged files; one that is gone already is fine. Returns the ones that could not be deleted
        (location -> reason), logged at WARNING and counted (module doc); a store that does not answer raises."""
        failed: dict[str, str] = {}
        if self._s3 is None:
            for location in locations:
                try:
                    pathlib.Path(location).unlink(missing_ok=True)
                except OSError as exc:
                    failed[location] = f"{type(exc).__name__}: {exc}"
        else:
            for start in range(0, len(locations), 1000):  # DeleteObjects takes up to 1000 keys
                chunk = locations[start:start + 1000]
                response = self._s3.client.delete_objects(Bucket=self._s3.settings.bucket, Delete={
                    "Objects": [{"Key": self._key(location)} for location in chunk], "Quiet": True})
                for error in response.get("Errors", []):  # S3 answers 200 and refuses keys one by one
                    failed[self._s3.settings.uri(error.get("Key", "?"))] = (
                        f"{error.get('Code', 'unknown')}: {error.get('Message', '')}".strip(": "))
        if failed:
            self._report(failed)
        return failed

    def _report(self, failed: dict[str, str]) -> None:
        reasons = Counter(reason.split(":", 1)[0] for reason in failed.values())
        with _delete_failures_lock:
            _delete_failures.update(reasons)
        hint = (f"; {DELETE_PERMISSION_HINT}" if "AccessDenied" in reasons else
                "; the service's user must be allowed to delete in the table's directory"
                if "PermissionError" in reasons else "")
        examples = ", ".join(f"{location} ({reason})" for location, reason in list(failed.items())[:3])
        log.warning("could not delete %d staged file(s) under %s (they stay until a later delete succeeds)%s: %s",
                    len(failed), self.root, hint, examples,
                    extra={"fields": {"event": "delta_staging_delete_failed", "files": len(failed),
                                      "reasons": dict(reasons)}})

    def listed(self, topic: str, partition: int) -> list[StagedFile]:
        """The partition's staged files, by their names (in a directory: after removing what a crashed
        widening left there, see the module doc)."""
        if self._s3 is None:
            directory = pathlib.Path(self.root) / topic / str(partition)
            _remove_stale(directory.glob(f"{WIDEN_SCRATCH_PREFIX}*"), WIDEN_LEFTOVER_AGE_S)
            names = [(str(p), p.name) for p in directory.glob("*.parquet") if not is_temp_name(p.name)]
        else:
            prefix = f"{self._s3.settings.prefix.strip('/')}/{topic}/{partition}/"
            pages = self._s3.client.get_paginator("list_objects_v2").paginate(
                Bucket=self._s3.settings.bucket, Prefix=prefix)
            names = [(self._s3.settings.uri(o["Key"]), o["Key"].rsplit("/", 1)[-1])
                     for page in pages for o in page.get("Contents", [])]
        staged = []
        for location, name in names:
            first, _, last = name.removesuffix(".parquet").partition("-")
            if first.isdigit() and last.isdigit():
                staged.append(StagedFile(location, int(first), int(last)))
        return sorted(staged, key=lambda s: s.first_offset)

    def _key(self, location: str) -> str:
        return location.removeprefix(f"{S3_SCHEME}{self._s3.settings.bucket}/")

    def close(self) -> None:
        self._target.close()


class DeltaStagingTarget:
    """The task's UploadTarget for a Delta table: its files are staged; the driver merges them."""

    name = "delta-staging"

    def __init__(self, settings: DeltaStagingSettings) -> None:
        self.settings = settings.delta
        self._areas: dict[str, StagingArea] = {}
        self._lock = threading.Lock()

    def area(self, topic: str) -> StagingArea:
        uri = self.settings.uri_for(topic)
        with self._lock:
            if uri not in self._areas:
                self._areas[uri] = StagingArea(self.settings, topic)
            return self._areas[uri]

    def upload(self, path: pathlib.Path, metadata: FileMetadata, on_retry: OnRetry | None = None) -> Receipt:
        return self.area(metadata.topic).stage(path, metadata, on_retry)

    def close(self) -> None:
        for area in self._areas.values():
            area.close()
        self._areas.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
