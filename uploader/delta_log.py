"""A Delta table's commit infos, read from its log entries as plain files (a directory or S3 through boto3).

delta-rs's `DeltaTable.history()` holds the GIL while it reads the log: from the driver's compaction thread every
S3 round trip would stop the driver's other threads, and a reader whose S3 server runs in its own process (moto in
the tests) waits on itself until a timeout. A log entry never changes once written, so each is read once.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

from uploader.delta_settings import S3_SCHEME, DeltaSettings
from uploader.delta_storage import s3_settings_at

_FILE_SCHEME = "file://"


class CommitLog:
    """The commit info of each version of one table's log."""

    def __init__(self, settings: DeltaSettings, uri: str) -> None:
        self.uri = uri.rstrip("/")
        self._s3: Any = None
        if self.uri.startswith(S3_SCHEME):
            from uploader.s3 import S3Target  # boto3 only for tables on S3

            self._s3 = S3Target(s3_settings_at(settings, self.uri))

    def commit_info(self, version: int) -> dict[str, Any] | None:
        """The version's commitInfo ({} without one); None when the entry is gone (the log's clean-up)."""
        text = self._read(f"_delta_log/{version:020d}.json")
        if text is None:
            return None
        for line in text.splitlines():
            if '"commitInfo"' in line:
                info = json.loads(line).get("commitInfo")
                if isinstance(info, dict):
                    return info
        return {}

    def _read(self, name: str) -> str | None:
        if self._s3 is None:
            root = self.uri[len(_FILE_SCHEME):] if self.uri.startswith(_FILE_SCHEME) else self.uri
            try:
                return (pathlib.Path(root) / name).read_text(encoding="utf-8")
            except FileNotFoundError:
                return None
        prefix = self._s3.settings.prefix.rstrip("/")
        body = self._s3.read(f"{prefix}/{name}" if prefix else name)
        return body.decode("utf-8") if body is not None else None

    def close(self) -> None:
        if self._s3 is not None:
            self._s3.close()
