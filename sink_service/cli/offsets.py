"""`sink-service offsets`: show the group's committed offsets and lag, or move them while it is stopped.

"Re-send everything since Tuesday 14:00" is `sink-service offsets --to-timestamp 2026-11-24T14:00:00+01:00`
and a restart: the image has no Kafka tooling, and the group's committed offsets are the service's
only progress record (ARCHITECTURE.md), so moving them is all a replay needs. The command uses the
service's own configuration (SINK_GROUP_ID, SINK_TOPICS or SINK_TOPIC_PATTERN, the SINK_KAFKA_*
security options) through the same `kafka_client_config()` and `KafkaOffsets` the service uses.

A move is refused while the group has members: a running service would commit over it (or follow
it mid-batch), and a broker that enforces membership refuses it anyway. An instance stopped a moment
ago stays a static member until its session times out; `--wait SECONDS` waits for the group to empty.
With SINK_TARGET=delta, a move back below what the table holds (its application transactions for the
group) is refused: the service skips every record the table holds, so such a replay re-applies nothing.
Exit codes: 0 done, 1 Kafka did not answer or refused the commit, 2 usage or configuration error or a
move a Delta table would ignore, 3 the group has active members.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from sink_service.config import SinkConfig
    from sink_service.kafka_source.offsets import KafkaOffsets
    from sink_service.kafka_source.positions import TP

EXIT_OK = 0
EXIT_KAFKA = 1
EXIT_USAGE = 2
EXIT_ACTIVE = 3
PROG = "sink-service offsets"


class UsageError(Exception):
    """Bad arguments or configuration: exit 2."""


@dataclass
class Row:
    """One partition as the command prints it; `after`/`note` only for a move."""

    topic: str
    partition: int
    committed: int | None
    log_start: int
    log_end: int
    lag: int | None
    after: int | None = None
    note: str = ""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Without a --to-* option the command only shows; with one it moves (or, --dry-run, plans)."""
    parser.add_argument("--json", action="store_true", help="one JSON document instead of a table")
    parser.add_argument("--topic", action="append", default=[], metavar="TOPIC",
                        help="only this configured topic (repeatable)")
    move = parser.add_mutually_exclusive_group()
    move.add_argument("--to-timestamp", metavar="ISO",
                      help="the first record at or after this time, e.g. 2026-11-24T14:00:00Z (offset required)")
    move.add_argument("--to-earliest", action="store_true", help="each partition's log start")
    move.add_argument("--to-latest", action="store_true", help="each partition's log end (skip the backlog)")
    move.add_argument("--to-offset", action="append", default=[], metavar="TOPIC:PARTITION=OFFSET",
                      help="an explicit offset (repeatable); other partitions are not moved")
    parser.add_argument("--dry-run", action="store_true", help="print the plan; commit nothing")
    parser.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                        help="wait up to this long for the group to have no active member (an instance "
                        "stopped a moment ago stays a static member until its session times out)")


def main(args: argparse.Namespace) -> int:
    return run(args, os.environ, sys.stdout, sys.stderr)


def run(args: argparse.Namespace, environ: Mapping[str, str], out: TextIO, err: TextIO) -> int:
    """The command with its environment and streams given, for tests."""
    from confluent_kafka import KafkaException

    from sink_service.config import ConfigError, load_config
    from sink_service.shared.kafka_access import KafkaAccessRefused

    try:
        moving = _move_requested(args)
        config = load_config(environ)
    except ConfigError as exc:
        print(f"{PROG}: {exc}", file=err)
        return EXIT_USAGE
    except UsageError as exc:
        print(f"{PROG}: {exc}", file=err)
        return EXIT_USAGE
    try:
        return _run(args, config, moving, out, err)
    except UsageError as exc:
        print(f"{PROG}: {exc}", file=err)
        return EXIT_USAGE
    except (KafkaException, KafkaAccessRefused) as exc:
        print(f"{PROG}: Kafka did not answer or refused (SINK_KAFKA_BOOTSTRAP_SERVERS, SINK_KAFKA_*): {exc}",
              file=err)
        return EXIT_KAFKA


def _move_requested(args: argparse.Namespace) -> bool:
    moving = bool(args.to_timestamp or args.to_earliest or args.to_latest or args.to_offset)
    if args.dry_run and not moving:
        raise UsageError("--dry-run plans a move: give --to-timestamp, --to-earliest, --to-latest or --to-offset")
    return moving


def _run(args: argparse.Namespace, config: SinkConfig, moving: bool, out: TextIO, err: TextIO) -> int:
    from sink_service.kafka_source.offsets import KafkaOffsets

    kafka = KafkaOffsets(config.kafka_client_config(), config.group_id)
    tps = _partitions(kafka, config, args.topic)
    committed = kafka.committed(tps)
    low, high = kafka.earliest(tps), kafka.latest(tps)
    rows = {tp: Row(tp[0], tp[1], committed.get(tp), low[tp], high[tp],
                    high[tp] - committed[tp] if tp in committed else None) for tp in tps}
    if not moving:
        _print(out, args.json, config.group_id, "show", None, False, list(rows.values()))
        return EXIT_OK
    what, plan = _plan(args, kafka, rows)
    if config.target == "delta":
        _refuse_below_delta_table(config, plan)
    members = _members(kafka, 0.0 if args.dry_run else args.wait)
    if members and not args.dry_run:
        print(f"{PROG}: refused: the group {config.group_id} has {len(members)} active member(s) "
              f"({', '.join(members)}); stop every instance of the service first. An instance stopped a moment "
              "ago stays a static member (group.instance.id) until its session times out (session.timeout.ms="
              f"{_session_timeout_ms(config)} ms, SINK_KAFKA_SESSION_TIMEOUT_MS): try again after that, or add "
              "--wait SECONDS to wait for the group to empty. Nothing was changed.", file=err)
        return EXIT_ACTIVE
    if not args.dry_run:
        kafka.alter(plan)
        now = kafka.committed(tps)  # read back: the table shows what Kafka holds, not what was asked
        for tp, row in rows.items():
            row.after = now.get(tp)
    else:
        for tp, row in rows.items():
            row.after = plan.get(tp, row.committed)
    for row in rows.values():
        row.lag = row.log_end - row.after if row.after is not None else None
    _print(out, args.json, config.group_id, "move", what, args.dry_run, list(rows.values()))
    return EXIT_OK


def _members(kafka: KafkaOffsets, wait_s: float) -> list[str]:
    """The group's active members, asked again each second for up to `wait_s` until there are none."""
    deadline = time.monotonic() + max(0.0, wait_s)
    while True:
        members = kafka.active_members()
        if not members or time.monotonic() >= deadline:
            return members
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


def _session_timeout_ms(config: SinkConfig) -> str:
    from sink_service.kafka_source.membership import DEFAULT_SESSION_TIMEOUT_MS

    return str(config.kafka_client_config().get("session.timeout.ms", DEFAULT_SESSION_TIMEOUT_MS))


def _refuse_below_delta_table(config: SinkConfig, plan: Mapping[TP, int]) -> None:
    """A Delta table skips every file below its application transaction for the group: a move back
    below it would be reported as a replay that never happens (the rows stay as they are)."""
    from sink_service.config.upload_targets import target_settings
    from uploader.delta_changes import delta_target
    from uploader.parking import ParkingSettings

    settings = target_settings(config)
    if isinstance(settings, ParkingSettings):
        settings = settings.inner
    with delta_target(settings) as table:
        below = []
        for (topic, partition), offset in sorted(plan.items()):
            try:
                covered = table.covered_to(topic, partition)
            except Exception as exc:  # deltalake's and the store's errors alike: no move without the answer
                raise UsageError(f"the Delta table {settings.uri_for(topic)} could not be read to check the move "
                                 f"({type(exc).__name__}: {exc}); nothing was changed") from exc
            if covered is not None and offset < covered:
                below.append(f"{topic}:{partition} to {offset}, but {settings.uri_for(topic)} holds it below "
                             f"{covered}")
    if below:
        raise UsageError(
            f"refused: SINK_TARGET=delta and the table already holds what this move would replay for group "
            f"{config.group_id} (its application transactions): {'; '.join(below)}. The service skips every "
            "record below the table's position, so nothing would be re-applied. Nothing was changed. To apply "
            "those records again: run the service once under a new SINK_GROUP_ID with "
            "SINK_STARTING_OFFSETS=timestamp:<time> (a table's transactions are per group; the merge keeps each "
            "key's newer row by the order column), re-apply saved files with `python -m uploader push`, or "
            "write to a new table (SINK_DELTA_TABLE_URI) from --to-earliest.")


def _partitions(kafka: KafkaOffsets, config: SinkConfig, only: Sequence[str]) -> list[TP]:
    try:
        tps = kafka.partitions(config.topics, config.topic_pattern)
    except KeyError as exc:
        raise UsageError(f"SINK_TOPICS names topic(s) the broker does not have: {exc.args[0]}") from None
    if not tps:
        raise UsageError(f"no topic matches SINK_TOPIC_PATTERN={config.topic_pattern}")
    if only:
        known = {t for t, _ in tps}
        unknown = sorted(set(only) - known)
        if unknown:
            raise UsageError(f"--topic {', '.join(unknown)}: not a configured topic (configured: "
                             f"{', '.join(sorted(known))})")
        tps = [tp for tp in tps if tp[0] in only]
    return tps


def _plan(args: argparse.Namespace, kafka: KafkaOffsets, rows: dict[TP, Row]) -> tuple[str, dict[TP, int]]:
    """What the move is called, and the new offset of every partition it moves."""
    from sink_service.shared.instants import epoch_ms, iso_ms, parse_instant

    if args.to_earliest:
        for row in rows.values():
            row.note = "log start"
        return "earliest", {tp: row.log_start for tp, row in rows.items()}
    if args.to_latest:
        for row in rows.values():
            row.note = "log end"
        return "latest", {tp: row.log_end for tp, row in rows.items()}
    if args.to_timestamp:
        try:
            when = epoch_ms(parse_instant(args.to_timestamp))
        except ValueError as exc:
            raise UsageError(f"--to-timestamp: {exc}") from None
        found = kafka.at_time(rows, when, {tp: r.log_start for tp, r in rows.items()},
                              {tp: r.log_end for tp, r in rows.items()})
        for tp, position in found.items():
            rows[tp].note = position.why
        return iso_ms(when), {tp: position.offset for tp, position in found.items()}
    plan: dict[TP, int] = {}
    for spec in args.to_offset:
        tp, offset = _offset_spec(spec)
        if tp not in rows:
            raise UsageError(f"--to-offset {spec}: {tp[0]}:{tp[1]} is not a partition of the configured "
                             "topic(s)" + (" selected by --topic" if args.topic else ""))
        row = rows[tp]
        if not row.log_start <= offset <= row.log_end:
            raise UsageError(f"--to-offset {spec}: outside the log [{row.log_start}, {row.log_end}]; the "
                             "service would stop on it (SINK_RETENTION_GAP_POLICY)")
        plan[tp] = offset
        row.note = "explicit"
    return "explicit offsets", plan


def _offset_spec(spec: str) -> tuple[TP, int]:
    where, _, offset = spec.rpartition("=")
    topic, _, partition = where.rpartition(":")
    try:
        if not topic:
            raise ValueError
        return (topic, int(partition)), int(offset)
    except ValueError:
        raise UsageError(f"--to-offset {spec!r}: expected TOPIC:PARTITION=OFFSET, e.g. orders:0=1200") from None


def _print(out: TextIO, as_json: bool, group: str, action: str, what: str | None, dry_run: bool,
           rows: list[Row]) -> None:
    if as_json:
        document = {"group": group, "action": action, "partitions": [_json_row(r, action) for r in rows]}
        if action == "move":
            document.update({"to": what, "dry_run": dry_run})
        print(json.dumps(document, indent=2), file=out)
        return
    if action == "show":
        header = ("TOPIC", "PARTITION", "COMMITTED", "LOG-START", "LOG-END", "LAG")
        table = [(r.topic, r.partition, _dash(r.committed), r.log_start, r.log_end, _dash(r.lag)) for r in rows]
        print(f"group {group}", file=out)
    else:
        header = ("TOPIC", "PARTITION", "BEFORE", "AFTER", "LOG-START", "LOG-END", "LAG-AFTER", "NOTE")
        table = [(r.topic, r.partition, _dash(r.committed), _dash(r.after), r.log_start, r.log_end, _dash(r.lag),
                  r.note) for r in rows]
        verb = "would move (dry run, nothing committed)" if dry_run else "moved"
        print(f"group {group}: {verb} to {what}", file=out)
    cells = [tuple(str(c) for c in line) for line in [header, *table]]
    widths = [max(len(line[i]) for line in cells) for i in range(len(header))]
    for line in cells:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip(), file=out)
    lags = [r.lag for r in rows if r.lag is not None]
    none = len(rows) - len(lags)
    print(f"total lag {sum(lags)}" + (f"; {none} partition(s) without a committed offset" if none else ""), file=out)


def _json_row(row: Row, action: str) -> dict[str, object]:
    data = asdict(row)
    if action == "show":
        for name in ("after", "note"):
            data.pop(name)
    else:
        data["before"] = data.pop("committed")
    return data


def _dash(value: int | None) -> str | int:
    return "-" if value is None else value
