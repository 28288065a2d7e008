"""The service with `SINK_TARGET=delta`: each micro-batch's files merged into a local Delta table (delta-rs) in
one commit by the driver.

A variant of the `service` system (same workload, same thresholds, same consumer-group progress), so the
two run side by side: `--systems service,delta`. Its output is read back from the table's log after the
run: the files each commit applied (`kafka_parquet_sink.files` in the commit info, read with
`uploader.delta.applied_files`; a micro-batch's commit applies several) and the commit's timestamp as each
file's arrival. Latency is measured over the rows the table holds at the end (the latest version of each
key: the last update of a key, so a sample biased to the end of the stream), each matched to the commit
that applied its partition's offset range. While it runs, the table is sampled once a minute (version, active
files, Parquet files on disk, log entries, checkpoints): `delta_samples` in the results, for issue 29's
"file count and log length bounded" over a long live run.
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import requests

from bench.systems import Output, RunContext, SinkService

SAMPLE_EVERY_S = 60


class SinkServiceDelta(SinkService):
    """(a'') this service merging each micro-batch into a Delta table on the local disk, instead of POSTing its
    files to EMS."""

    name, label = "delta", "sink service -> Delta table"
    pushes_to_endpoint = False

    def extra_env(self, ctx: RunContext) -> dict[str, str]:
        self.table_dir = ctx.work / "delta_table"
        return {"SINK_TARGET": "delta", "SINK_DELTA_TABLE_URI": str(self.table_dir)}

    def start(self, ctx: RunContext, group: str) -> None:
        super().start(ctx, group)
        self.samples: list[dict] = []
        self._stop_sampling = threading.Event()
        self._sampler = threading.Thread(target=self._sample_table, name="delta-table-sampler", daemon=True)
        self._sampler.start()

    def _sample_table(self) -> None:
        started = time.monotonic()
        while not self._stop_sampling.wait(SAMPLE_EVERY_S):
            if (self.table_dir / "_delta_log").is_dir():
                try:
                    self.samples.append({"at_s": round(time.monotonic() - started), **table_files(self.table_dir)})
                except Exception as exc:  # a sample must not end the run
                    self.samples.append({"at_s": round(time.monotonic() - started), "error": repr(exc)[:200]})

    def before_stop(self) -> dict:
        found = super().before_stop()
        self._stop_sampling.set()
        self._sampler.join(timeout=30)
        try:  # a merge that lost to another writer's commit (another instance) is retried as `delta_conflict`
            text = requests.get(f"http://127.0.0.1:{self.http_port}/metrics", timeout=5).text
            for match in re.finditer(r'^sink_upload_retries_total\{reason="([^"]+)"\}\s+([0-9.eE+-]+)$', text, re.M):
                found[f"retries_{match.group(1)}"] = float(match.group(2))
        except requests.RequestException:
            pass
        try:
            found["delta_samples"] = [*self.samples, {"at_s": "end", **table_files(self.table_dir)}]
            found.update(delta_summary(self.table_dir))
        except Exception as exc:  # the numbers of the run must survive a table that cannot be read
            found["delta_error"] = f"{type(exc).__name__}: {exc}"
        return found

    def output(self, ctx: RunContext, endpoint) -> Output:
        return delta_output(self.table_dir)


def _commits(table_dir: Path) -> list[dict]:
    """Every commit of the JSON log: version, timestamp (ms), bytes added/removed and the Kafka files it applied
    (`files`: one {file, app_id, first_offset, last_offset, applied_from} each; empty for other commits)."""
    from uploader.delta import applied_files  # deltalake only where a delta run reads its table

    out = []
    for entry in sorted((table_dir / "_delta_log").glob("*.json")):
        commit = {"version": int(entry.stem), "added": 0, "removed": 0, "files_added": 0, "files": []}
        for line in entry.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                commit["added"] += int(action["add"].get("size") or 0)
                commit["files_added"] += 1
            elif "remove" in action:
                commit["removed"] += int(action["remove"].get("size") or 0)
            elif "commitInfo" in action:
                info = action["commitInfo"]
                commit.update(timestamp_ms=info.get("timestamp"), operation=info.get("operation"),
                              files=applied_files(info))
        out.append(commit)
    return out


def table_files(table_dir: Path) -> dict:
    """What the table holds on its store: active files, all Parquet files (removed ones await vacuum), log."""
    from deltalake import DeltaTable

    log = table_dir / "_delta_log"
    table = DeltaTable(str(table_dir))
    data_files = [f for f in table_dir.rglob("*.parquet") if f.parent != log]  # checkpoints are Parquet too
    return {"version": table.version(), "active_files": len(table.file_uris()),
            "parquet_on_disk": len(data_files),
            "parquet_on_disk_mb": round(sum(f.stat().st_size for f in data_files) / 1e6, 1),
            "log_entries": sum(1 for _ in log.glob("*.json")),
            "checkpoints": sum(1 for _ in log.glob("*.checkpoint.parquet"))}


def delta_summary(table_dir: Path) -> dict:
    """What the table looks like after the run: merge commits and the Kafka files they applied, table files,
    bytes, rows, and the bytes merges rewrote."""
    from deltalake import DeltaTable

    table = DeltaTable(str(table_dir))
    commits = _commits(table_dir)
    merges = [c for c in commits if c["files"]]
    actions = table.get_add_actions(flatten=True)
    sizes = actions.column("size_bytes").to_pylist() if actions.num_rows else []
    return {"delta_version": table.version(), "delta_merge_commits": len(merges),
            "delta_file_applications": sum(len(c["files"]) for c in merges), "delta_files": len(sizes),
            "delta_mb": sum(sizes) / 1e6, "delta_rows": table.count(),
            "delta_mb_written": sum(c["added"] for c in commits) / 1e6,
            "delta_mb_rewritten": sum(c["removed"] for c in commits) / 1e6}


def delta_output(table_dir: Path) -> Output:
    """Files: each file entry of each merge commit (a micro-batch's commit applies several); bytes: what those
    commits added (the rewrite included); per row the table holds, its Kafka timestamp and the time of the
    commit that applied its partition's offset."""
    from deltalake import DeltaTable

    commits = [c for c in _commits(table_dir) if c["files"]]
    # (partition, last offset, commit time) per applied file; a partition may have several files in one commit
    applied = [(int(f["app_id"].rsplit("/", 1)[-1]), int(f["last_offset"]), c["timestamp_ms"] / 1000)
               for c in commits for f in c["files"]]
    out = Output(files=len(applied), bytes=sum(c["added"] for c in commits))
    if not applied:
        return out
    # The table's files read with pyarrow (no partition columns here): to_pyarrow_table() in this process, after
    # DeltaTarget merges in it, once ended the interpreter with "terminate called without an active exception".
    columns = ["_partition", "_offset", "_timestamp"]
    rows = pa.concat_tables([pq.read_table(uri, columns=columns) for uri in DeltaTable(str(table_dir)).file_uris()])
    out.rows = rows.num_rows
    partition = rows.column("_partition").to_numpy()
    offset = rows.column("_offset").to_numpy()
    stamp = rows.column("_timestamp").cast("int64").to_numpy()
    unit = rows.schema.field("_timestamp").type.unit
    stamp_ms = (stamp * {"s": 1000, "ms": 1, "us": 1e-3, "ns": 1e-6}[unit]).astype(np.int64)
    arrival = np.full(rows.num_rows, np.nan)
    for p in np.unique(partition):
        mine = sorted((last, at) for partition_, last, at in applied if partition_ == p)
        if not mine:
            continue
        lasts = np.array([last for last, _ in mine])
        times = np.array([t for _, t in mine])
        where = partition == p
        index = np.searchsorted(lasts, offset[where])  # the first commit whose last offset >= the row's offset
        found = index < len(lasts)
        values = np.full(index.size, np.nan)
        values[found] = times[index[found]]
        arrival[where] = values
    known = ~np.isnan(arrival)
    out.upload_s, out.produced_ms = arrival[known], stamp_ms[known]
    return out
