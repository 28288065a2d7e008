"""File metadata for uploader tests: one builder, each test file choosing its own defaults."""

from __future__ import annotations

from collections.abc import Callable

from uploader.target import FileMetadata

_BASE = {
    "topic": "orders",
    "partition": 3,
    "first_offset": 10,
    "last_offset": 12,
    "record_count": 3,
    "target_table": "orders",
    "primary_keys": ("id",),
    "order_column": "_offset",
    "schema_fingerprint": "abc123",
}


def metadata_builder(**defaults: object) -> Callable[..., FileMetadata]:
    """`metadata(**overrides)` for a test file; call-site overrides win over the file's defaults."""

    def build(**overrides: object) -> FileMetadata:
        return FileMetadata(**{**_BASE, **defaults, **overrides})

    return build
