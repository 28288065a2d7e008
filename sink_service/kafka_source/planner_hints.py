"""What the driver learns from finished ranges and hands to the planner (another process).

Two hints, per topic: Parquet bytes per record (admission estimates a partition's file size
before writing it) and the widest column types written so far (the floor of later files, so a
column never narrows between files of one table). Both are learned anew by each run of the
service; nothing about delivery depends on them.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path

HINTS_FILE = "planner-hints.json"


@dataclass
class PlannerHints:
    bytes_per_record: dict[str, float] = field(default_factory=dict)
    column_types: dict[str, str] = field(default_factory=dict)  # topic -> encoded schema

    def learn_size(self, topic: str, size_bytes: int, records: int) -> None:
        if records <= 0:
            return
        sample = size_bytes / records
        old = self.bytes_per_record.get(topic)
        self.bytes_per_record[topic] = sample if old is None else 0.7 * old + 0.3 * sample

    def learn_types(self, topic: str, widened: str) -> None:
        """`widened`: a range's floor joined with what it wrote, or "" when that added nothing."""
        known = self.column_types.get(topic)
        if not widened or widened == known:
            return
        if known is None:
            self.column_types[topic] = widened
            return
        # Only when ranges planned on different floors widened a topic: the driver of a target other
        # than Delta loads pyarrow for nothing else.
        from uploader.column_types import decode_schema, encode_schema, join_schemas

        self.column_types[topic] = encode_schema(join_schemas(decode_schema(known), decode_schema(widened)))

    def save(self, directory: Path) -> None:
        path = directory / HINTS_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"bytes_per_record": self.bytes_per_record, "column_types": self.column_types}))
        tmp.replace(path)

    @classmethod
    def load(cls, directory: Path) -> PlannerHints:
        """The last saved hints; none yet (or unreadable) is no hint."""
        with contextlib.suppress(OSError, ValueError, KeyError):
            data = json.loads((directory / HINTS_FILE).read_text())
            return cls(dict(data["bytes_per_record"]), dict(data["column_types"]))
        return cls()
