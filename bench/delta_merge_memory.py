"""Peak memory of the driver's Delta merge against the rows it merges (issue 37, item 11).

    .venv/bin/python -m bench.delta_merge_memory                    # 32, 64 and 128 MiB of rows
    .venv/bin/python -m bench.delta_merge_memory --sizes-mib 64,256

For each size a child process builds a small table (10k keys) and writes 8 staged files of distinct new keys
shaped like the benchmark workload (bench.delta_common.rows, zstd as the service writes them) whose rows add
up to about that many MiB in Arrow (what SINK_DELTA_MERGE_MAX_BYTES counts); another child applies them
with `uploader.delta.DeltaTarget.merge`, as the driver does for one group. Measured: that child's peak RSS
(ru_maxrss) before and after the merge, and the merge's growth per MiB of Parquet and of Arrow rows: the
factor that turns SINK_DELTA_MERGE_MAX_BYTES into the driver's memory. Writes
bench/results/delta_merge_memory.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"
MIB = 1024 * 1024
FILES = 8
ARROW_BYTES_PER_ROW = 135  # of bench.delta_common.rows, measured; sizes are approximate


def child(spec: dict) -> dict:
    """`build`: the table and the staged files; `merge`: the measured merge, in a process of its own."""
    import numpy as np
    import pyarrow.parquet as pq
    from deltalake import write_deltalake

    from bench.delta_common import max_rss_mb, rows
    from uploader.delta import DeltaFile, DeltaTarget
    from uploader.delta_settings import DeltaSettings
    from uploader.target import FileMetadata

    work = Path(spec["work"])
    table_dir = work / "table"
    base = 10_000
    per_file = max(1, spec["mib"] * MIB // ARROW_BYTES_PER_ROW // FILES)
    first = base // FILES + 1
    metadata = [FileMetadata(topic="bench", partition=p, first_offset=first, last_offset=first + per_file - 1,
                             record_count=per_file, target_table="bench", primary_keys=("id",),
                             order_column="_offset", schema_fingerprint="bench") for p in range(FILES)]
    paths = [work / f"staged-{p}.parquet" for p in range(FILES)]
    if spec["step"] == "build":
        write_deltalake(str(table_dir), rows(np.arange(base, dtype=np.int64), partitions=FILES,
                                             offsets=np.arange(base, dtype=np.int64) // FILES, version=0, seed=1))
        arrow_bytes = 0
        for p, path in enumerate(paths):
            ids = base + np.arange(per_file, dtype=np.int64) * FILES + p
            table = rows(ids, partitions=FILES, offsets=np.arange(first, first + per_file), version=1, seed=p)
            arrow_bytes += table.nbytes
            pq.write_table(table, path, compression="zstd")
        return {"arrow_mib": arrow_bytes / MIB, "parquet_mib": sum(p.stat().st_size for p in paths) / MIB}
    target = DeltaTarget(DeltaSettings(table_uri=str(table_dir), group_id="bench", compact_every_commits=0,
                                       vacuum_every_commits=0))
    target.covered_to("bench", 0)  # the table opened, as the driver's is between batches
    before = max_rss_mb()
    target.merge([DeltaFile(path, m) for path, m in zip(paths, metadata, strict=True)])
    after = max_rss_mb()
    return {"rows": per_file * FILES, "rss_before_mib": before, "rss_peak_mib": after,
            "merge_growth_mib": after - before}


def _run_child(spec: dict) -> dict:
    out = subprocess.run([sys.executable, "-m", "bench.delta_merge_memory", "--child", json.dumps(spec)],
                         check=True, capture_output=True, text=True, cwd=BENCH.parent)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes-mib", default="32,64,128")
    args = parser.parse_args()
    results = []
    for mib in (int(s) for s in args.sizes_mib.split(",")):
        work = Path(tempfile.mkdtemp(prefix="delta-merge-memory-"))
        try:
            built = _run_child({"mib": mib, "work": str(work), "step": "build"})
            merged = _run_child({"mib": mib, "work": str(work), "step": "merge"})
            results.append({"mib_asked": mib, **built, **merged,
                            "growth_per_parquet_mib": merged["merge_growth_mib"] / built["parquet_mib"],
                            "growth_per_arrow_mib": merged["merge_growth_mib"] / built["arrow_mib"]})
            print(json.dumps(results[-1]), flush=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "delta_merge_memory.json").write_text(json.dumps(results, indent=2))
    lines = ["| Parquet MiB | rows | Arrow MiB | RSS before | RSS peak | merge growth | growth / Parquet MiB | "
             "growth / Arrow MiB |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['parquet_mib']:.1f} | {r['rows']:,} | {r['arrow_mib']:.0f} | {r['rss_before_mib']:.0f} | "
              f"{r['rss_peak_mib']:.0f} | {r['merge_growth_mib']:.0f} | {r['growth_per_parquet_mib']:.1f}x | "
              f"{r['growth_per_arrow_mib']:.1f}x |"
              for r in results]
    (RESULTS / "delta_merge_memory.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        print(json.dumps(child(json.loads(sys.argv[2]))))
    else:
        main()
