"""Concurrent writers on one Delta table: throughput and conflicts, per-file merges against batch merges (issue 29,
item 4).

    .venv/bin/python -m bench.delta_concurrency                          # dir and moto S3, 1/2/4 writers (~5 min)
    .venv/bin/python -m bench.delta_concurrency --stores dir --writers 1,4 --batches 2

A table of `--keys` keys (no partition column unless `--partition-by _partition`) receives `--batches`
micro-batches of 8 files (one per Kafka partition, `--rows` rows each, half updates, half new keys). W writer
processes start together; writer w owns the Kafka partitions p with p % W == w:

- `per-file xW` (`--writers`): W executor tasks of the design before the driver merged micro-batches: each
  applies its files in offset order with `uploader.delta.DeltaTarget.merge` of one file, one commit per file.
- `batch xW` (`--batch-writers`, 1 by default): W instances of one consumer group, each driver merging its
  partitions' files of each micro-batch in one commit with `uploader.delta.DeltaTarget.merge`, as the service does.

Both go through DeltaTarget's own conflict handling (`max_commit_retries=0`; a conflict is a `delta_conflict`
RetryableUploadError, retried with the service's default retry policy: 60 s budget, 0.5 s initial backoff, full
jitter); retries are counted with the `on_retry` callback.

Every case starts from a fresh copy of the table. Afterwards the table is checked: the expected row count, and
every file applied exactly once (each file entry of each commit's `kafka_parquet_sink.files`, read from the
table's history with `uploader.delta.applied_files`). S3 is moto's server (`ThreadedMotoServer`, in this process).
Writes bench/results/delta_concurrency.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from bench.measure import ProcessTreeSampler, machine_info

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"
WORK = RESULTS / "tmp" / "delta_concurrency"
PARTITIONS = 8
BUCKET = "bench-delta"


def log(message: str) -> None:
    print(f"[delta-conc {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _settings(spec: dict):
    from uploader.delta_settings import DeltaSettings

    return DeltaSettings(table_uri=spec["uri"], group_id="bench", partition_by=tuple(spec["partition_by"]),
                         endpoint_url=spec.get("endpoint"))


def _files(spec: dict):
    from bench.delta_common import micro_batch

    return [micro_batch(Path(spec["scratch"]) / f"batch{b}", keys=spec["keys"], partitions=PARTITIONS,
                        files=PARTITIONS, rows_per_file=spec["rows"], update_share=0.5, batch=b, seed=2000 + b)
            for b in range(spec["batches"])]


# --- children -------------------------------------------------------------------------------------------

def child_prepare(spec: dict) -> dict:
    """The base table at spec['uri'] and every micro-batch's files under spec['scratch'] (same seeds: same files)."""
    import pyarrow as pa
    from deltalake import write_deltalake

    from bench.delta_common import schema, table_batches
    from uploader.delta_storage import storage_options

    options = storage_options(_settings(spec))
    started = time.monotonic()
    reader = pa.RecordBatchReader.from_batches(schema(), table_batches(spec["keys"], PARTITIONS))
    write_deltalake(spec["uri"], reader, partition_by=spec["partition_by"] or None, storage_options=options or None)
    _files(spec)
    return {"build_s": time.monotonic() - started}


def _mine(files: list, spec: dict) -> list:
    """The files of the partitions this writer owns (p % writers == writer)."""
    return [f for f in files if f.metadata.partition % spec["writers"] == spec["writer"]]


def child_writer(spec: dict) -> dict:
    """One per-file writer: its partitions' files, in offset order, through DeltaTarget.upload; starts at
    spec['start_at']."""
    from uploader.delta import DeltaTarget

    batches = _files(spec)
    target = DeltaTarget(_settings(spec))
    retries: Counter[str] = Counter()

    def on_retry(error, attempt: int, wait_s: float) -> None:
        retries[error.reason] += 1

    time.sleep(max(0.0, spec["start_at"] - time.time()))
    uploads = []
    for files in batches:
        for f in _mine(files, spec):
            t0 = time.time()
            try:
                details, attempts = target.merge([f], on_retry)  # one file per commit, with its transaction
                uploads.append({"start": t0, "end": time.time(), "attempts": attempts,
                                "skipped": bool(details.get("skipped")), "files": 1})
            except Exception as exc:  # a file that exhausted its retry budget: the batch would fail and replay
                uploads.append({"start": t0, "end": time.time(), "error": f"{type(exc).__name__}: {exc}"[:300]})
    return {"uploads": uploads, "retries": dict(retries)}


def child_batch(spec: dict) -> dict:
    """One instance's driver: its partitions' files of each micro-batch merged in one commit with
    DeltaTarget.merge, conflicts with other instances retried by DeltaTarget as `delta_conflict`."""
    from uploader.delta import DeltaTarget

    batches = _files(spec)
    target = DeltaTarget(_settings(spec))
    retries: Counter[str] = Counter()

    def on_retry(error, attempt: int, wait_s: float) -> None:
        retries[error.reason] += 1

    time.sleep(max(0.0, spec["start_at"] - time.time()))
    uploads = []
    for files in batches:
        mine = _mine(files, spec)
        t0 = time.time()
        try:
            details, attempts = target.merge(mine, on_retry)
            uploads.append({"start": t0, "end": time.time(), "attempts": attempts,
                            "skipped": bool(details.get("skipped")), "files": len(mine)})
        except Exception as exc:  # a merge that exhausted its retry budget: the micro-batch would fail and replay
            uploads.append({"start": t0, "end": time.time(), "error": f"{type(exc).__name__}: {exc}"[:300]})
    return {"uploads": uploads, "retries": dict(retries)}


def child_check(spec: dict) -> dict:
    """Rows in the table, and how many commits applied each file (each file entry of each commit's info)."""
    from deltalake import DeltaTable

    from uploader.delta import applied_files
    from uploader.delta_storage import storage_options

    options = storage_options(_settings(spec))
    table = DeltaTable(spec["uri"], storage_options=options or None)
    applied = Counter(f["file"] for h in table.history() for f in applied_files(h))
    return {"rows": table.count(), "version": table.version(), "file_applications": sum(applied.values()),
            "files_applied_twice": sum(n > 1 for n in applied.values()), "distinct_files_applied": len(applied)}


CHILDREN = {"prepare": child_prepare, "writer": child_writer, "batch": child_batch, "check": child_check}


def spawn(step: str, spec: dict, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "bench.delta_concurrency", "--child", step, json.dumps(spec)],
                            cwd=BENCH.parent, stdout=subprocess.PIPE, text=True, env=env)


def collect(process: subprocess.Popen, timeout_s: float) -> dict:
    try:
        out, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        return {"error": f"timed out after {timeout_s:.0f}s"}
    if process.returncode != 0:
        return {"error": f"exit code {process.returncode}"}
    return json.loads(out.strip().splitlines()[-1])


# --- the driver -----------------------------------------------------------------------------------------

def run_case(design: str, writers: int, store: str, args, env: dict[str, str], endpoint: str | None) -> dict:
    name = f"{store}_{design}_{writers}"
    scratch = WORK / name
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    uri = f"s3://{BUCKET}/{name}" if store == "s3" else str(scratch / "table")
    spec = {"uri": uri, "scratch": str(scratch / "files"), "keys": args.keys, "rows": args.rows,
            "batches": args.batches, "partition_by": [args.partition_by] if args.partition_by else [],
            "endpoint": endpoint}
    prepared = collect(spawn("prepare", spec, env), args.timeout)
    if prepared.get("error"):
        return {"error": f"prepare: {prepared['error']}"}
    start_at = time.time() + 3.0  # every writer imported and its files read before the clock starts
    processes = [spawn("writer" if design == "per-file" else "batch",
                       {**spec, "writer": w, "writers": writers, "start_at": start_at}, env) for w in range(writers)]
    samplers = [ProcessTreeSampler(p.pid, ours={"benchmark": [os.getpid()]}).__enter__() for p in processes]
    results = [collect(p, args.timeout) for p in processes]
    for s in samplers:
        s.stop()
    if bad := [r["error"] for r in results if r.get("error")]:
        return {"error": "; ".join(bad)}
    uploads = [u for r in results for u in r["uploads"]]
    failed = [u["error"] for u in uploads if u.get("error")]
    ok = [u for u in uploads if not u.get("error")]
    wall = max(u["end"] for u in uploads) - start_at
    retries = Counter()
    for r in results:
        retries.update(r["retries"])
    commits = len(ok)
    check = collect(spawn("check", spec, env), args.timeout)
    rows = args.batches * PARTITIONS * args.rows
    out = {
        "design": design, "writers": writers, "store": store, "wall_s": wall, "records": rows,
        "records_per_s": rows / wall, "commits": commits, "failed_uploads": len(failed), "failures": failed[:3],
        "conflicts": retries.get("delta_conflict", 0), "other_retries": sum(retries.values()) - retries.get(
            "delta_conflict", 0),
        "conflicts_per_commit": retries.get("delta_conflict", 0) / commits if commits else None,
        "max_attempts": max((u["attempts"] for u in ok), default=0),
        "commit_latency_mean_s": sum(u["end"] - u["start"] for u in ok) / commits if commits else None,
        "commit_latency_max_s": max((u["end"] - u["start"] for u in ok), default=None),
        "peak_rss_mb_sum": sum(s.peak_rss for s in samplers) / 2**20,
        "other_load_cores": sum(s.other_cpu_s for s in samplers) / len(samplers) / max(samplers[0].wall_s, 1e-9),
        "check": check,
        "rows_expected": args.keys + rows // 2,
        "files_expected": args.batches * PARTITIONS,
    }
    shutil.rmtree(scratch, ignore_errors=True)
    return out


def markdown(report: dict) -> str:
    s = report["settings"]
    lines = [f"## Delta: concurrent writers on one table ({report['started_at']})", "",
             f"Machine: {report['machine']}. Table of {s['keys']:,} keys (partitioned by "
             f"{s['partition_by'] or 'nothing'}); {s['batches']} micro-batches x 8 files x {s['rows']:,} rows "
             "(half updates). Other load: CPU used by other processes on the machine, in cores (busy during "
             "these runs).", "",
             "| store | design | writers | records/s | wall s | commits | conflicts | conflicts per commit | "
             "max attempts | mean / max s per commit | failed uploads | files applied twice | rows ok | other load |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|---:|"]
    for r in report["cases"]:
        if r.get("error"):
            lines.append(f"| {r.get('store')} | {r.get('design')} | {r.get('writers')} | failed: {r['error']} |")
            continue
        c = r["check"]
        lines.append(
            f"| {r['store']} | {r['design']} | {r['writers']} | {r['records_per_s']:,.0f} | {r['wall_s']:.1f} | "
            f"{r['commits']} | {r['conflicts']} | {r['conflicts_per_commit']:.2f} | {r['max_attempts']} | "
            f"{r['commit_latency_mean_s']:.2f} / {r['commit_latency_max_s']:.2f} | {r['failed_uploads']} | "
            f"{c.get('files_applied_twice', '?')} ({c.get('distinct_files_applied', '?')} of "
            f"{r['files_expected']} applied) | "
            f"{'yes' if c.get('rows') == r['rows_expected'] else c.get('rows')} | "
            f"{r['other_load_cores']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", nargs=2, metavar=("STEP", "SPEC"), help=argparse.SUPPRESS)
    parser.add_argument("--stores", default="dir,s3", help="comma list of dir, s3 (moto)")
    parser.add_argument("--writers", default="1,2,4", help="comma list of writer counts for the per-file design")
    parser.add_argument("--batch-writers", default="1",
                        help=f"comma list of instance counts for the batch design (at most {PARTITIONS})")
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--rows", type=int, default=5000, help="rows per file")
    parser.add_argument("--batches", type=int, default=3, help="micro-batches of 8 files")
    parser.add_argument("--partition-by", default="", help="partition column of the table, e.g. _partition")
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(CHILDREN[args.child[0]](json.loads(args.child[1]))))
        return 0
    stores = [x for x in args.stores.split(",") if x]
    counts = [int(x) for x in args.writers.split(",") if x]
    batch_counts = [int(x) for x in args.batch_writers.split(",") if x]
    if any(not 1 <= w <= PARTITIONS for w in counts + batch_counts):
        parser.error(f"writer counts must be between 1 and {PARTITIONS} (one Kafka partition at least each)")
    report = {"started_at": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": machine_info(),
              "settings": {"keys": args.keys, "rows": args.rows, "batches": args.batches,
                           "partition_by": args.partition_by}, "cases": []}
    env = dict(os.environ, AWS_ACCESS_KEY_ID="bench-key-id", AWS_SECRET_ACCESS_KEY="bench-secret",
               AWS_EC2_METADATA_DISABLED="true", AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull)
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        env.pop(name, None)
    for store in stores:
        server = endpoint = None
        if store == "s3":
            import boto3
            from moto.server import ThreadedMotoServer

            server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
            server.start()
            host, port = server.get_host_and_port()
            endpoint = f"http://{host}:{port}"
            boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="bench-key-id",
                         aws_secret_access_key="bench-secret").create_bucket(Bucket=BUCKET)
        try:
            for design, writers in [("per-file", w) for w in counts] + [("batch", w) for w in batch_counts]:
                log(f"{store}: {design} x{writers}")
                result = run_case(design, writers, store, args, env, endpoint)
                result.setdefault("design", design)
                result.setdefault("writers", writers)
                result.setdefault("store", store)
                report["cases"].append(result)
                log(f"  {json.dumps({k: v for k, v in result.items() if k not in ('failures',)}, default=str)[:400]}")
                args.out.mkdir(parents=True, exist_ok=True)
                (args.out / "delta_concurrency.json").write_text(json.dumps(report, indent=1))
                (args.out / "delta_concurrency.md").write_text(markdown(report))
        finally:
            if server is not None:
                server.stop()
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
