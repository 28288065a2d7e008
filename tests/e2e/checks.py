"""Assertions shared by the end-to-end tests."""

from __future__ import annotations

import re

import psutil
import requests
from prometheus_client.parser import text_string_to_metric_families

from devkit.kafka_data import Workload, committed_offsets, end_offsets
from local_ems.server import LocalEmsServer

_FILE_NAME = re.compile(
    r"topic-(?P<topic>.+)_partition-(?P<p>\d+)_firstOffset-(?P<f>\d+)_lastOffset-(?P<l>\d+)\.parquet"
)


def table_matches(ems: LocalEmsServer, topic: str, workload: Workload) -> bool:
    try:
        rows = ems.table(topic)
    except Exception:
        return False
    expected = workload.expected_rows(topic)
    got = {row["id"]: row for row in rows}
    return len(got) == len(expected) and all(got[k]["version"] == v["version"] for k, v in expected.items())


def assert_table_exact(ems: LocalEmsServer, topic: str, workload: Workload) -> None:
    rows = ems.table(topic)
    expected = workload.expected_rows(topic)
    got = {row["id"]: row for row in rows}
    assert len(rows) == len(expected), f"{topic}: {len(rows)} rows, expected {len(expected)}"
    for key, value in expected.items():
        row = got[key]
        for field in ("version", "status", "amount", "customer", "note"):
            assert row[field] == value[field], f"{topic} {key}.{field}: {row[field]!r} != {value[field]!r}"


def all_committed(bootstrap: str, group: str, topic: str, partitions: int) -> bool:
    return committed_offsets(bootstrap, group, topic, partitions) == end_offsets(bootstrap, topic, partitions)


def uploaded_ranges(ems: LocalEmsServer, topic: str) -> dict[int, list[tuple[int, int]]]:
    ranges: dict[int, list[tuple[int, int]]] = {}
    for upload in ems.uploads(topic):
        match = _FILE_NAME.fullmatch(upload["fileName"])
        assert match, f"unexpected file name {upload['fileName']!r}"
        assert match["topic"] == topic
        ranges.setdefault(int(match["p"]), []).append((int(match["f"]), int(match["l"])))
    return ranges


def assert_ranges_cover(ems: LocalEmsServer, topic: str, ends: dict[int, int], allow_replays: bool) -> int:
    """Uploaded offset ranges cover [0, end) of every partition with no gap; returns the file count."""
    ranges = uploaded_ranges(ems, topic)
    files = 0
    for partition, end in ends.items():
        spans = sorted(set(ranges.get(partition, [])))
        files += len(spans)
        assert spans, f"{topic}:{partition} has no uploaded file"
        if not allow_replays:
            assert len(spans) == len(ranges[partition]), f"{topic}:{partition} uploaded a range twice"
        covered = 0
        for first, last in spans:
            assert first <= covered, f"{topic}:{partition}: gap, offsets {covered}..{first - 1} never uploaded"
            if not allow_replays:
                assert first == covered, f"{topic}:{partition}: overlap at {first} (expected {covered})"
            covered = max(covered, last + 1)
        assert covered == end, f"{topic}:{partition}: uploads end at {covered}, partition ends at {end}"
    return files


def scrape_metrics(port: int) -> dict[tuple[str, tuple], float]:
    """Every sample of the service's /metrics, keyed by (name, sorted labels)."""
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def metric_total(samples: dict, name: str, **labels: str) -> float:
    """The sum of `name` over the samples whose labels include `labels`."""
    return sum(v for (n, ls), v in samples.items() if n == name and all((k, v2) in ls for k, v2 in labels.items()))


_FRESH_START = re.compile(r" WARNING .*topic=(\S+) (?:partition=\d+|partitions=\S+ \((\d+)\)): "
                          r"no committed offset in consumer group ")


def partitions_said_fresh(output: str, topic: str) -> int:
    """Partitions of `topic` the service's WARNINGs say started without a committed offset (one line
    names one partition, or several as `partitions=0-5 (6)`)."""
    return sum(int(m[2] or 1) for m in map(_FRESH_START.search, output.splitlines()) if m and m[1] == topic)


def duplicate_overhead(ems: LocalEmsServer, topic: str, ends: dict[int, int]) -> float:
    """Offsets uploaded (replays counted again) per distinct offset: 1.0 means nothing was re-sent."""
    spans = uploaded_ranges(ems, topic)
    sent = sum(last - first + 1 for ranges in spans.values() for first, last in ranges)
    return sent / sum(ends.values())


def descendant_commands(pid: int) -> list[str]:
    """The command lines of a process's living descendants (Spark's JVM and Python workers)."""
    commands = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            commands.append(" ".join(child.cmdline()))
        except psutil.Error:  # ended meanwhile, or a zombie (the JVM's short-lived helpers)
            continue
    return commands


def all_commands() -> list[str]:
    """The command line of every process on the machine, as `ps` shows them to any local user."""
    commands = []
    for process in psutil.process_iter():
        try:
            commands.append(" ".join(process.cmdline()))
        except psutil.Error:
            continue
    return commands
