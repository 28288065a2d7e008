"""A Delta table's health over a long run at a steady rate (issue 29, item 5), without Kafka.

The test broker cannot hold a 30-minute topic at 20k records/s (noida-db keeps the whole log in memory and
snapshots it as one JSON file; bench/README). The table's health does not depend on Kafka, so this drives the
driver's own call, `DeltaTarget.merge` of one micro-batch's files (one file per Kafka partition), every
`--interval` seconds at `--rate` records/s of updates over `--keys` keys, with the service's maintenance
settings (compaction every 100 versions, vacuum every 1000 with 168 h retention). Once a minute it samples
the table: version, active files, Parquet files and MB on disk, log entries, checkpoints, and the minute's
merge times; it reports whether the merges kept up (a merge longer than the interval puts the next batch late).

    .venv/bin/python -m bench.delta_table_health --seconds 1800     # 30 minutes at 20k records/s
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results" / "delta-health"
PARTITIONS = 8


def log(message: str) -> None:
    print(f"[delta-health {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> dict:
    import pyarrow as pa
    from deltalake import write_deltalake

    from bench.delta_common import micro_batch, schema, table_batches
    from bench.systems.delta_table import table_files
    from uploader.delta import DeltaTarget
    from uploader.delta_settings import DeltaSettings

    work = args.out / "work"
    shutil.rmtree(work, ignore_errors=True)
    table_dir, scratch = work / "table", work / "files"
    write_deltalake(str(table_dir), pa.RecordBatchReader.from_batches(schema(), table_batches(args.keys, PARTITIONS)))
    target = DeltaTarget(DeltaSettings(table_uri=str(table_dir), group_id="bench"))
    rows_per_file = args.rate * args.interval // PARTITIONS
    started = time.monotonic()
    samples, minute_merges, maintenance, late_s, batch = [], [], [], 0.0, 0
    next_batch = next_sample = started
    while time.monotonic() - started < args.seconds:
        now = time.monotonic()
        if now >= next_sample:
            sample = {"at_s": round(now - started), **table_files(table_dir), "batches": batch}
            if minute_merges:
                sample.update(merge_p50_s=round(statistics.median(minute_merges), 3),
                              merge_max_s=round(max(minute_merges), 3))
            samples.append(sample)
            log(json.dumps(sample))
            minute_merges = []
            next_sample += 60
        if now < next_batch:
            time.sleep(min(next_batch, next_sample) - now)
            continue
        late_s = max(late_s, now - next_batch)
        files = micro_batch(scratch, keys=args.keys, partitions=PARTITIONS, files=PARTITIONS,
                            rows_per_file=rows_per_file, update_share=1.0, batch=batch, seed=batch)
        t0 = time.monotonic()
        details, _ = target.merge(files)
        minute_merges.append(time.monotonic() - t0)
        if details.get("maintenance"):
            maintenance.append({"version": details["committed_version"], **details["maintenance"]})
        for f in files:
            f.path.unlink()
        batch += 1
        next_batch += args.interval
    end = {"at_s": "end", **table_files(table_dir), "batches": batch}
    samples.append(end)
    log(json.dumps(end))
    return {"rate": args.rate, "seconds": args.seconds, "interval_s": args.interval, "keys": args.keys,
            "records": batch * rows_per_file * PARTITIONS, "max_late_s": round(late_s, 2), "samples": samples,
            "maintenance": maintenance}


def markdown(report: dict) -> str:
    lines = [f"## Delta table health: {report['rate']:,} records/s for {report['seconds']:.0f} s, "
             f"{report['keys']:,} keys, a merge every {report['interval_s']} s",
             "", f"{report['records']:,} records merged; the latest batch started at most {report['max_late_s']} s "
             "late (0: every merge finished within its interval).", "",
             "| at s | batches | version | active files | Parquet files / MB on disk | log entries | checkpoints "
             "| merge p50 / max s |", "|---:|---:|---:|---:|---|---:|---:|---|"]
    for s in report["samples"]:
        merges = f"{s['merge_p50_s']} / {s['merge_max_s']}" if "merge_p50_s" in s else ""
        lines.append(f"| {s['at_s']} | {s['batches']} | {s['version']} | {s['active_files']} | "
                     f"{s['parquet_on_disk']} / {s['parquet_on_disk_mb']} | {s['log_entries']} | {s['checkpoints']} "
                     f"| {merges} |")
    lines += ["", "Maintenance runs: " + json.dumps(report["maintenance"])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=20_000, help="records per second")
    parser.add_argument("--seconds", type=float, default=1800)
    parser.add_argument("--interval", type=int, default=5, help="seconds between micro-batches")
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    report = run(args)
    (args.out / "delta_table_health.json").write_text(json.dumps(report, indent=2))
    (args.out / "delta_table_health.md").write_text(markdown(report))
    shutil.rmtree(args.out / "work", ignore_errors=True)
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
