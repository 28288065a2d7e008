"""`verify`'s flow: positions -> the topic's rows (spilled) -> the target's files -> compare per table."""

from __future__ import annotations

import tempfile
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sink_service.config import STRUCTURED_KEY_FORMATS, SinkConfig, transform_for
from sink_service.verify.compare import Comparer
from sink_service.verify.expected import ExpectedRows, partitions_of, positions, read_expected, topics_of
from sink_service.verify.report import Report
from sink_service.verify.target import (
    NO_READ_BACK,
    CannotVerify,
    TargetRows,
    TargetUnreadable,
    delta_table,
    directory_files,
    ems_table,
    export_files,
    local_ems_root,
    s3_files,
)


@dataclass(frozen=True)
class VerifyOptions:
    examples: int = 10
    target_export: Path | None = None  # Parquet files to compare with instead of reading the target
    memory_limit: str = "512MB"  # duckdb's
    temp_dir: Path | None = None  # spill files and duckdb's database; default: the system's temp dir
    progress: Callable[[str], None] = lambda _line: None  # a line per step, for a person waiting


def verify(config: SinkConfig, options: VerifyOptions) -> Report:
    """Compare the target with the topics up to the group's committed offsets (and its rows ahead of
    them with the records past them).

    Raises `CannotVerify` (exit 2): an EMS that cannot be read back, no primary keys, no such topic.
    """
    if config.target == "ems" and options.target_export is None:
        _check_ems_readable(config)
    if not config.primary_keys and config.key_format not in STRUCTURED_KEY_FORMATS:
        raise CannotVerify("SINK_PRIMARY_KEYS is not set: the target appends rows instead of upserting them, so "
                           "there is no latest row per key to compare")
    from sink_service.config.decode_spec import decode_spec  # the service's own spec: one source

    topics = topics_of(config)
    parts = positions(config, partitions_of(config, topics))
    for part in parts:
        options.progress(f"{part.topic}:{part.partition} " + (part.note or
                         f"offsets {part.earliest} to {part.committed} (committed)"))
    with tempfile.TemporaryDirectory(prefix="sink-verify-", dir=options.temp_dir) as scratch:
        work = Path(scratch)
        expected = read_expected(config, decode_spec(config), transform_for(config), work / "expected", parts)
        report = Report(config.group_id, "", config.order_field, expected.primary_keys, parts,
                        expected.bad_records, expected.filtered)
        options.progress(f"read {sum(p.records for p in parts):,} records into {len(expected.files)} spill file(s), "
                         f"{sum(p.beyond_records for p in parts):,} past the committed offsets into "
                         f"{len(expected.beyond_files)}")
        if expected.bad_records.get("tombstone") and config.tombstones == "skip":
            report.notes.append(f"{expected.bad_records['tombstone']:,} tombstone(s) skipped (SINK_TOMBSTONES=skip): "
                                "the service never deletes, so such keys keep their last row in the target too")
        if not expected.primary_keys:
            raise CannotVerify("no primary keys: SINK_PRIMARY_KEYS is unset and no record had a key to learn them from")
        tables: dict[str, list[str]] = defaultdict(list)
        for topic in topics:
            tables[_table_of(config, topic)].append(topic)
        if options.target_export is not None and len(tables) > 1:
            raise CannotVerify(f"--target-export holds one table, but the topics go to {len(tables)} "
                               f"({', '.join(sorted(tables))}): set SINK_TOPICS to the topics of one table")
        comparer = Comparer(work / "duckdb", options.memory_limit)
        try:
            for n, (table, table_topics) in enumerate(sorted(tables.items())):
                # Numbered, not named: a table's name may be a path or an s3:// URI.
                target = _target_rows(config, options, table, table_topics, expected, work / "target" / str(n))
                report.target = target.described
                options.progress(f"comparing table {table} with {len(target.files)} file(s) of {target.described}")
                report.uncommitted_files += target.uncommitted_files
                report.notes += target.notes
                spill = [path for topic, path in expected.files if topic in table_topics]
                beyond = [path for topic, path in expected.beyond_files if topic in table_topics]
                result = comparer.compare(table, spill, target.files, expected.primary_keys, config.order_field,
                                          options.examples, beyond)
                report.tables.append(result)
        finally:
            comparer.close()
    return report


def _table_of(config: SinkConfig, topic: str) -> str:
    """The table a topic's rows end in: an EMS table name, or a Delta table's URI."""
    if config.target == "delta":
        return (config.delta_table_uri or "").replace("{topic}", topic)
    return config.table_for(topic)


def _check_ems_readable(config: SinkConfig) -> None:
    """Fail before reading the topics when the EMS cannot be read back (the real one)."""
    if local_ems_root(config.ems_endpoint or "") is None:
        raise TargetUnreadable(NO_READ_BACK)


def _target_rows(config: SinkConfig, options: VerifyOptions, table: str, topics: list[str],
                 expected: ExpectedRows, download: Path) -> TargetRows:
    if options.target_export is not None:
        return export_files(options.target_export)
    committed = expected.committed()
    if config.target == "dir":
        return directory_files(Path(config.dir_path or ""), topics, committed)
    if config.target == "s3":
        return s3_files(config, topics, committed, download)
    if config.target == "ems":
        return ems_table(config, table, download)
    if config.target == "delta":
        return delta_table(config, table, download, topics[0], expected.primary_keys)
    raise TargetUnreadable(f"SINK_TARGET={config.target} cannot be verified")


