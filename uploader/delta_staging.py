"""Staging beside a Delta table: tasks put their closed files here, the driver merges a micro-batch's files
in one commit (sink_service.driver.delta_batches) and deletes them.

A staged file lives at `<table>/_sink_staging/<group>/<topic>/<partition>/<first:020d>-<last:020d>.parquet`,
written by the directory or S3 target (atomic; a replay of the same range overwrites the same name). Delta
readers and vacuum leave `_`-prefixed directories alone. The table's store is used, not the driver's disk,
so executors on other machines reach it too. Nothing staged is needed after a crash: the offsets are not
committed before the merge, so a replay stages the range again; staged files the table already covers are
deleted after each batch's commit and, for leftovers of failed batches, when a query starts.
"""

from __future__ import annotations

import pathlib
import threading
from dataclasses import dataclass
from typing import Any, Self
from urllib.parse import quote

from uploader.delta_settings import S3_SCHEME, DeltaSettings
from uploader.directory import DirectorySettings, DirectoryTarget, is_temp_name
from uploader.retry import OnRetry
from uploader.s3_settings import S3Settings
from uploader.target import FileMetadata, Receipt

STAGING_DIR = "_sink_staging"


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

            bucket, _, prefix = self.root[len(S3_SCHEME):].partition("/")
            self._s3 = S3Target(S3Settings(
                bucket=bucket, prefix=prefix, endpoint_url=settings.endpoint_url, region=settings.region,
                ca_bundle=settings.ca_bundle, request_timeout_s=settings.request_timeout_s, retry=settings.retry))
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

    def delete(self, locations: list[str]) -> None:
        """Delete staged files; one that is gone already is fine."""
        if self._s3 is None:
            for location in locations:
                pathlib.Path(location).unlink(missing_ok=True)
            return
        for start in range(0, len(locations), 1000):  # DeleteObjects takes up to 1000 keys
            chunk = locations[start:start + 1000]
            self._s3.client.delete_objects(Bucket=self._s3.settings.bucket, Delete={
                "Objects": [{"Key": self._key(location)} for location in chunk], "Quiet": True})

    def listed(self, topic: str, partition: int) -> list[StagedFile]:
        """The partition's staged files, by their names."""
        if self._s3 is None:
            directory = pathlib.Path(self.root) / topic / str(partition)
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
