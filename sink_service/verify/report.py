"""What `verify` found, for people (text) and machines (`--json`)."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from sink_service.verify.compare import FAILING, STATUSES, TableResult
from sink_service.verify.expected import PartitionRead

_WHY = {
    "missing": "in the topic, not in the target",
    "stale": "the target holds an older version: a lower order value",
    "extra": "in the target, not in the topic",
    "differing": "the record with the target's order value holds other content",
    "invented": "the target's order value is past the topic's latest and no record has it",
    "ahead": "the target holds a record past the committed offsets: uploaded before the commit (not a failure)",
}


@dataclass
class Report:
    group: str
    target: str
    order_column: str
    primary_keys: tuple[str, ...]
    partitions: list[PartitionRead] = field(default_factory=list)
    bad_records: Counter = field(default_factory=Counter)
    filtered: int = 0
    uncommitted_files: int = 0
    tables: list[TableResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def equal(self) -> bool:
        return all(t.equal for t in self.tables)

    def totals(self) -> dict[str, int]:
        totals = {"keys_checked": sum(t.keys_checked for t in self.tables)}
        for status in STATUSES:
            totals["keys_equal" if status == "equal" else status] = sum(t.counts[status] for t in self.tables)
        totals["deleted"] = sum(t.deleted_keys for t in self.tables)
        return totals

    def as_dict(self) -> dict[str, Any]:
        return {
            "equal": self.equal,
            "group": self.group,
            "target": self.target,
            "order_column": self.order_column,
            "primary_keys": list(self.primary_keys),
            **self.totals(),
            "records_read": sum(p.records for p in self.partitions),
            "records_past_commit": sum(p.beyond_records for p in self.partitions),
            "bad_records": dict(self.bad_records),
            "filtered": self.filtered,
            "uncommitted_files_skipped": self.uncommitted_files,
            "partitions": [{"topic": p.topic, "partition": p.partition, "earliest": p.earliest,
                            "committed": p.committed, "records": p.records, "rows": p.rows, "end": p.end,
                            "records_past_commit": p.beyond_records,
                            **({"note": p.note} if p.note else {})} for p in self.partitions],
            "tables": [{"table": t.table, "keys_checked": t.keys_checked, "keys_equal": t.counts["equal"],
                        **{s: t.counts[s] for s in STATUSES if s != "equal"}, "deleted": t.deleted_keys,
                        "examples": t.examples, "notes": t.notes} for t in self.tables],
            "notes": self.notes,
        }

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2, default=str)

    def to_text(self) -> str:
        lines = [f"verify: group {self.group} -> {self.target}; primary keys {', '.join(self.primary_keys) or '-'}, "
                 f"order column {self.order_column}"]
        read = sum(p.records for p in self.partitions)
        bad = sum(self.bad_records.values())
        lines.append(f"read {read:,} records from {len(self.partitions)} partition(s) up to the committed offsets"
                     + (f"; {bad:,} not rows ({_counts(self.bad_records)})" if bad else "")
                     + (f"; {self.filtered:,} filtered by SINK_TRANSFORM_SQL" if self.filtered else ""))
        beyond = sum(p.beyond_records for p in self.partitions)
        if beyond:
            lines.append(f"read {beyond:,} records past the committed offsets, to compare the target's rows "
                         "ahead of them")
        lines += [f"  {p.topic}:{p.partition} {p.note}" for p in self.partitions if p.note]
        if self.uncommitted_files:
            lines.append(f"  {self.uncommitted_files} target file(s) past the committed offsets not compared")
        lines += [f"  note: {n}" for n in self.notes]
        for t in self.tables:
            lines.append(f"table {t.table}: keys checked {t.keys_checked:,}, equal {t.counts['equal']:,}, "
                         + ", ".join(f"{s} {t.counts[s]:,}" for s in STATUSES if s != "equal")
                         + (f"; {t.deleted_keys:,} deleted in the topic" if t.deleted_keys else ""))
            lines += [f"  note: {n}" for n in t.notes]
            for status, examples in t.examples.items():
                lines.append(f"  {status} ({_WHY[status]}), first {len(examples)} of {t.counts[status]:,}:")
                lines += [f"    {_example(e)}" for e in examples]
        totals = self.totals()
        verdict = "EQUAL" if self.equal else "NOT EQUAL: " + ", ".join(
            f"{totals[s]:,} {s}" for s in FAILING if totals[s])
        lines.append(f"result: {verdict}")
        return "\n".join(lines)


def _counts(counter: Counter) -> str:
    return ", ".join(f"{kind} {n:,}" for kind, n in sorted(counter.items()))


def _example(e: dict[str, Any]) -> str:
    key = json.dumps(e["key"], default=str, separators=(",", ":"))
    parts = [f"key {key}"]
    if "topic" in e:
        parts.append(f"topic {e['topic']} partition {e['partition']} offset {e['offset']}"
                     + (" (past the committed offset)" if e.get("past_commit") else ""))
    if "expected_order" in e or "target_order" in e:
        parts.append(f"order {e.get('expected_order', '-')} in the topic, {e.get('target_order', '-')} in the target")
    if "target_file" in e:
        parts.append(f"target {e['target_file']}")
    origin = [f"{name[len('target_'):] if name.startswith('target_') else name} {e[name]}"
              for name in ("target_topic", "target_partition", "target_offset") if name in e]
    if origin:
        parts.append("written from " + " ".join(origin))
    if e.get("differences"):
        parts.append("differs in " + ", ".join(_difference(c, d) for c, d in e["differences"].items()))
    return "; ".join(parts)


def _difference(column: str, d: dict[str, Any]) -> str:
    def shown(value: Any) -> str:
        return json.dumps(value, default=str, separators=(",", ":"))

    if d.get("target_lacks_column"):
        return f"{column} {shown(d['expected'])} in the topic, no such column in the target"
    target = shown(d["target"]) + (f" (not a {d['target_does_not_cast_to']})" if "target_does_not_cast_to" in d
                                   else "")
    return f"{column} {shown(d['expected'])} in the topic, {target} in the target"
