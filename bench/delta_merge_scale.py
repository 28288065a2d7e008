"""What one micro-batch's merge costs as the Delta table grows (issue 29, items 4 and 7).

    .venv/bin/python -m bench.delta_merge_scale                       # 100k and 1M keys (~6 min quiet)
    .venv/bin/python -m bench.delta_merge_scale --keys 100000,1000000,10000000 --layouts plain

For each table size and layout a base table of N keys is built once (in a child process), then copied per
mode, and one child process per mode merges the same micro-batches into its copy:

- `per-file`: `uploader.delta.DeltaTarget.merge` of each file alone (one MERGE commit per file, each with its
  partition's application transaction): the service's design before the driver merged micro-batches;
- `batch`: the service's design, `uploader.delta.DeltaTarget.merge` of the micro-batch's files as the driver
  calls it: ONE commit with the latest row per key across the files and every partition's application transaction.

Both use delta-rs's default `streamed_exec` (DeltaTarget does not expose it); the `-pruned` modes that compared
`streamed_exec=False` were dropped with the benchmark's own batch merge.

A micro-batch is `--files` files (one per Kafka partition) of `--rows` rows, half updates of existing keys
spread over the whole table and half new keys. Layouts: `plain` (no partition column, one write: files of
delta-rs's default target size, as after `optimize.compact()`), `partitioned` (by `_partition`, the Kafka
partition, 8 values), `small-files` (no partition column, grown by appends of 50k rows: uncompacted).

Measured per mode: wall time of the micro-batch's merges, the child's peak RSS (ru_maxrss, imports and the
source files included), files and bytes added and removed per commit (the JSON log), and the CPU the rest of
the machine used meanwhile (`other load`). Writes bench/results/delta_merge_scale.{json,md}; tables go to
bench/results/tmp/delta_merge_scale/ and are deleted after each size.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.measure import ProcessTreeSampler, machine_info

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"
WORK = RESULTS / "tmp" / "delta_merge_scale"
PARTITIONS = 8  # Kafka partitions of the topic: a key k lives in partition k % 8
SMALL_FILE_ROWS = 50_000
MODES = ("per-file", "batch")
LAYOUTS = ("plain", "partitioned", "small-files")


def log(message: str) -> None:
    print(f"[delta-merge {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- children: each step in its own process, so its peak RSS is its own ---------------------------------

def child_build(spec: dict) -> dict:
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    from bench.delta_common import schema, table_batches, table_files

    table_dir, keys, layout = Path(spec["table"]), spec["keys"], spec["layout"]
    started = time.monotonic()
    partition_by = ["_partition"] if layout == "partitioned" else None
    if layout == "small-files":
        DeltaTable.create(str(table_dir), schema())
        for batch in table_batches(keys, PARTITIONS, chunk=SMALL_FILE_ROWS):
            write_deltalake(str(table_dir), pa.table(batch), mode="append")
        DeltaTable(str(table_dir)).create_checkpoint()  # a service's table has checkpoints; 200 commits of log
    else:
        reader = pa.RecordBatchReader.from_batches(schema(), table_batches(keys, PARTITIONS))
        write_deltalake(str(table_dir), reader, partition_by=partition_by)
    files, size = table_files(table_dir)
    return {"build_s": time.monotonic() - started, "table_files": files, "table_bytes": size,
            "version": DeltaTable(str(table_dir)).version()}


def child_merge(spec: dict) -> dict:
    """Merge spec['batches'] micro-batches into spec['table'] the way spec['mode'] says."""
    from deltalake import DeltaTable

    from bench.delta_common import log_actions, max_rss_mb, micro_batch, table_files
    from uploader.delta import DeltaTarget
    from uploader.delta_settings import DeltaSettings

    table_dir, mode = Path(spec["table"]), spec["mode"]
    settings = DeltaSettings(table_uri=str(table_dir), group_id="bench",
                             partition_by=("_partition",) if spec["layout"] == "partitioned" else ())
    target = DeltaTarget(settings)
    before = DeltaTable(str(table_dir)).version()
    rss_before = max_rss_mb()
    batches = []
    for b in range(spec["batches"]):
        files = micro_batch(Path(spec["scratch"]) / f"batch{b}", keys=spec["keys"], partitions=PARTITIONS,
                            files=spec["files"], rows_per_file=spec["rows"], update_share=spec["update_share"],
                            batch=b, seed=1000 + b)
        if mode == "per-file":  # --per-file-files: a part of the micro-batch, for the biggest tables
            files = files[:spec["per_file_files"]]
        started = time.monotonic()
        per_commit = []
        if mode == "per-file":
            for f in files:
                t0 = time.monotonic()
                details, _ = target.merge([f])  # one file per commit, with its transaction
                per_commit.append({"s": time.monotonic() - t0, **{k: v for k, v in details.items()
                                                                   if k.startswith("num_")}})
        elif mode == "batch":
            t0 = time.monotonic()
            details, _ = target.merge(files)
            per_commit.append({"s": time.monotonic() - t0, **{k: v for k, v in details.items()
                                                              if k.startswith("num_")}})
        else:
            raise ValueError(mode)
        batches.append({"seconds": time.monotonic() - started, "commits": per_commit})
    actions = log_actions(table_dir, before)
    files, size = table_files(table_dir)
    final = DeltaTable(str(table_dir))
    inserts = spec["rows"] - int(spec["rows"] * spec["update_share"])
    merged = min(spec["files"], spec["per_file_files"]) if mode == "per-file" else spec["files"]
    expected = spec["keys"] + spec["batches"] * merged * inserts
    return {"batches": batches, "log": actions, "peak_rss_mb": max_rss_mb(), "rss_before_merge_mb": rss_before,
            "table_files_after": files, "table_bytes_after": size, "rows_after": final.count(),
            "rows_expected": expected}


def run_child(step: str, spec: dict, timeout_s: float) -> dict:
    """One step in a child process; its result, with the rest of the machine's load while it ran."""
    command = [sys.executable, "-m", "bench.delta_merge_scale", "--child", step, json.dumps(spec)]
    process = subprocess.Popen(command, cwd=BENCH.parent, stdout=subprocess.PIPE, text=True)
    sampler = ProcessTreeSampler(process.pid, ours={"benchmark": [os.getpid()]}).__enter__()
    try:
        out, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        sampler.stop()
        return {"error": f"timed out after {timeout_s:.0f}s"}
    sampler.stop()
    if process.returncode != 0:
        return {"error": f"exit code {process.returncode}"}
    result = json.loads(out.strip().splitlines()[-1])
    result["sampled_peak_rss_mb"] = sampler.peak_rss / 2**20
    result["cpu_s"] = sampler.tree_cpu_s
    result["other_load_cores"] = sampler.other_cpu_s / sampler.wall_s if sampler.wall_s else None
    result["steal_cores"] = sampler.steal_cpu_s / sampler.wall_s if sampler.wall_s else None
    return result


# --- the driver -----------------------------------------------------------------------------------------

def summarise(result: dict) -> dict:
    """Per micro-batch: seconds, merge commits, Kafka files they applied, table files and bytes added and
    removed by all commits (maintenance included), averaged over the batches."""
    log_ = result["log"]
    n = len(result["batches"])
    merges = [c for c in log_ if c["files"]]  # not maintenance: commits that applied Kafka files
    return {
        "seconds_per_batch": sum(b["seconds"] for b in result["batches"]) / n,
        "seconds_batches": [round(b["seconds"], 2) for b in result["batches"]],
        "commits_per_batch": len(merges) / n,
        "file_applications_per_batch": sum(len(c["files"]) for c in merges) / n,  # each file entry of each commit
        "seconds_per_commit": sum(c["s"] for b in result["batches"] for c in b["commits"]) / max(1, len(merges)),
        "files_added_per_batch": sum(c["files_added"] for c in log_) / n,
        "files_removed_per_batch": sum(c["files_removed"] for c in log_) / n,
        "mb_added_per_batch": sum(c["bytes_added"] for c in log_) / n / 1e6,
        "mb_removed_per_batch": sum(c["bytes_removed"] for c in log_) / n / 1e6,
        "rows_copied_per_batch": sum(c.get("num_target_rows_copied", 0) for b in result["batches"]
                                     for c in b["commits"]) / n,
    }


def markdown(report: dict) -> str:
    lines = [f"## Delta merge cost as the table grows ({report['started_at']})", "",
             f"Machine: {report['machine']}. Micro-batch: {report['settings']['files']} files x "
             f"{report['settings']['rows']:,} rows ({report['settings']['update_share']:.0%} updates of random "
             f"existing keys, the rest new keys), {report['settings']['batches']} micro-batch(es) per case, "
             "numbers per micro-batch (mean).", "",
             "| keys | layout | table files / MB | mode | commits | s per commit | s per batch | MB rewritten (removed)"
             " | MB written (added) | files removed / added | rows copied | peak RSS MB | other load (cores) |",
             "|---:|---|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    for case in report["cases"]:
        build = case["build"]
        for mode, r in case["modes"].items():
            if r.get("error"):
                lines.append(f"| {case['keys']:,} | {case['layout']} | | {mode} | failed: {r['error']} ||||||||")
                continue
            s = r["summary"]
            lines.append(
                f"| {case['keys']:,} | {case['layout']} | {build['table_files']} / {build['table_bytes'] / 1e6:,.0f} | "
                f"{mode} | {s['commits_per_batch']:.0f} | {s['seconds_per_commit']:.2f} | {s['seconds_per_batch']:.2f} "
                f"({', '.join(map(str, s['seconds_batches']))}) | {s['mb_removed_per_batch']:,.1f} | "
                f"{s['mb_added_per_batch']:,.1f} | "
                f"{s['files_removed_per_batch']:.0f} / {s['files_added_per_batch']:.0f} | "
                f"{s['rows_copied_per_batch']:,.0f} | {r['peak_rss_mb']:,.0f} | {r['other_load_cores'] or 0:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", nargs=2, metavar=("STEP", "SPEC"), help=argparse.SUPPRESS)
    parser.add_argument("--keys", default="100000,1000000", help="comma list of table sizes (keys)")
    parser.add_argument("--layouts", default="plain,partitioned", help=f"comma list of {', '.join(LAYOUTS)}")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma list of {', '.join(MODES)}")
    parser.add_argument("--files", type=int, default=8, help="files per micro-batch (one per Kafka partition)")
    parser.add_argument("--rows", type=int, default=5000, help="rows per file")
    parser.add_argument("--per-file-files", type=int, default=None,
                        help="the per-file mode merges only this many of a micro-batch's files (10M keys: the whole "
                             "batch takes too long; 's per commit' then extrapolates)")
    parser.add_argument("--update-share", type=float, default=0.5)
    parser.add_argument("--batches", type=int, default=2, help="micro-batches merged per case, one after another")
    parser.add_argument("--timeout", type=float, default=600, help="seconds one child step may take")
    parser.add_argument("--out", type=Path, default=RESULTS, help="directory for delta_merge_scale.{json,md}")
    args = parser.parse_args(argv)
    if args.child:
        step, spec = args.child[0], json.loads(args.child[1])
        print(json.dumps({"build": child_build, "merge": child_merge}[step](spec)))
        return 0
    sizes = [int(k) for k in args.keys.split(",") if k.strip()]
    layouts = [x.strip() for x in args.layouts.split(",") if x.strip()]
    modes = [x.strip() for x in args.modes.split(",") if x.strip()]
    if bad := [x for x in layouts if x not in LAYOUTS] + [m for m in modes if m not in MODES]:
        parser.error(f"unknown layout(s) or mode(s): {bad}")
    report = {"started_at": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": machine_info(),
              "settings": {"files": args.files, "rows": args.rows, "update_share": args.update_share,
                           "batches": args.batches, "partitions": PARTITIONS}, "cases": []}
    shutil.rmtree(WORK, ignore_errors=True)
    for keys in sizes:
        for layout in layouts:
            base = WORK / f"{keys}_{layout}" / "base"
            base.parent.mkdir(parents=True, exist_ok=True)
            log(f"{keys:,} keys, {layout}: building the table")
            build = run_child("build", {"table": str(base), "keys": keys, "layout": layout}, args.timeout)
            case = {"keys": keys, "layout": layout, "build": build, "modes": {}}
            report["cases"].append(case)
            if build.get("error"):
                log(f"build failed: {build['error']}")
                continue
            log(f"built in {build['build_s']:.1f}s: {build['table_files']} files, {build['table_bytes'] / 1e6:,.0f} MB")
            for mode in modes:
                table = base.parent / mode
                shutil.copytree(base, table)
                spec = {"table": str(table), "scratch": str(base.parent / f"{mode}_files"), "mode": mode,
                        "layout": layout, "keys": keys, "files": args.files, "rows": args.rows,
                        "update_share": args.update_share, "batches": args.batches,
                        "per_file_files": args.per_file_files or args.files}
                result = run_child("merge", spec, args.timeout)
                if not result.get("error"):
                    result["summary"] = summarise(result)
                    if result["rows_after"] != result["rows_expected"]:
                        result["error"] = (f"{result['rows_after']} rows in the table, "
                                           f"{result['rows_expected']} expected")
                case["modes"][mode] = result
                s = result.get("summary")
                log(f"  {mode}: " + (
                    f"{s['seconds_per_batch']:.2f}s per batch, {s['commits_per_batch']:.0f} commits applying "
                    f"{s['file_applications_per_batch']:.0f} files, "
                    f"{s['mb_removed_per_batch']:,.1f} MB rewritten, peak RSS {result['peak_rss_mb']:,.0f} MB, "
                    f"other load {result['other_load_cores'] or 0:.2f}" if s else f"failed: {result['error']}"))
                shutil.rmtree(table, ignore_errors=True)
            shutil.rmtree(base.parent, ignore_errors=True)
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "delta_merge_scale.json").write_text(json.dumps(report, indent=1))
            (args.out / "delta_merge_scale.md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
