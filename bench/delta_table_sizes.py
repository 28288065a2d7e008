"""Delta tables of 100k to 10M keys fed live: change-log mode against merge mode (issue #40).

    .venv/bin/python -m bench.delta_table_sizes --keys 100000,1000000,10000000 --minutes 5
    .venv/bin/python -m bench.delta_table_sizes --keys 100000 --minutes 1 --merge-minutes 1 --scaling-batches 4  # smoke

In merge mode every micro-batch's merge rewrites every table file holding one of its keys: with updates spread
over the keys, the whole table, so the bytes written and the merge time grow with the table (bench/README.md,
*Delta Lake target*). Change-log mode (uploader.delta_changes) appends the batch to `<table>__changes` and a
background compaction (uploader.delta_compaction) merges it into the keyed table bucket by bucket once the change
log holds `compact_at_ratio` of the keyed table's bytes. This measures both, per table size, without Kafka (the
test broker cannot hold a long topic; bench/README), calling what the service's driver calls:

1. `build`: the keyed table of N keys in change-log layout (partitioned by `_bucket`, `buckets_of` of the key), the
   rows of bench/delta_common; for merge mode a plain table (no partition column) of the same rows;
2. `files`: the feed's micro-batches, written before the clock starts (a task writes them in the service): every
   `--interval` s one batch of rate x interval rows over 8 Kafka partitions (8 Parquet files, `_offset` the order
   column), every row an update of a key drawn uniformly from the N keys;
3. `feed` (change-log mode): batch b is due at start + (b + 1) x interval (when the service's micro-batch would
   close); it is applied with `ChangeLogTarget.merge` as soon as it is due and the previous one is done, while a
   background thread runs `Compaction.due` / `compact` as the driver will. Per batch: append seconds, lateness
   (start - due: growing = falling behind), freshness (due -> the change log's snapshot, reopened, holds the batch's
   application transaction: what a reader of the view sees); per compaction: seconds, buckets, rows. At the end:
   the process's peak RSS (the driver), bytes written (the `size` of every `add` action in both tables' JSON logs
   during the run) against the batches' Parquet bytes, bytes on disk (no vacuum ran: what a 168 h retention keeps);
4. `verify`: the view (`uploader.delta_view.current_batches`) holds every key once with its latest version and
   amount; then a final compaction and the keyed table alone, the same;
5. `feed` in merge mode (`DeltaTarget.merge` per batch on a copy of the plain table), `--merge-minutes` or
   `--merge-batches` batches at most (10M keys cannot keep a 5 s cadence), stopped once 60 s behind;
6. `scaling` (once, on a copy of the largest size's keyed table): 1 and 2 processes appending the same batches to one
   change log (process w owns the Kafka partitions p % W == w) as fast as they can, no compaction: records/s,
   conflicts retried, and each partition's transaction and the change log's row count checked. With
   `--scaling-pin` also with instance w pinned to core w (a core per instance, as instances on their own hosts
   have: one instance already uses more than one of this machine's two cores). Each instance commits its
   partitions' ranges of a batch, so two commit twice as often for the same rows: an append's fixed cost (~0.1 s:
   reading the log, the transactions, the commit) weighs with small ranges (the live feed's 12,500 rows) and
   hardly with an instance that is behind (`--scaling-rows-per-file 100000`, SINK_FLUSH_RECORDS' ranges).

Each step runs in its own process (peak RSS its own); `other load` is the CPU the rest of the machine used
meanwhile, in cores. Writes bench/results/delta_table_sizes.{json,md} (results of sizes not run this time are kept);
tables go to bench/results/tmp/delta_table_sizes/ and are deleted after each size.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.measure import ProcessTreeSampler, machine_info

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"
WORK = RESULTS / "tmp" / "delta_table_sizes"
PARTITIONS = 8
BEHIND_S = 60.0  # a feed this late has fallen behind: stop it


def log(message: str) -> None:
    print(f"[delta-sizes {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _settings(uri: str, change_log: bool):
    from uploader.delta_settings import DeltaSettings

    return DeltaSettings(table_uri=uri, group_id="bench", change_log=change_log)


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def _delta_files(manifest: dict, batches: int) -> list[list]:
    """The DeltaFiles of the first `batches` micro-batches of a `files` step's manifest."""
    from bench.delta_common import ORDER, PRIMARY_KEYS, TOPIC
    from uploader.delta import DeltaFile
    from uploader.target import FileMetadata

    return [[DeltaFile(Path(f["path"]), FileMetadata(
        topic=TOPIC, partition=f["partition"], first_offset=f["first"], last_offset=f["last"],
        record_count=f["last"] - f["first"] + 1, target_table="bench", primary_keys=PRIMARY_KEYS, order_column=ORDER,
        schema_fingerprint="bench")) for f in batch] for batch in manifest["batches"][:batches]]


# --- children: each step in its own process, so its peak RSS is its own ---------------------------------

def child_build(spec: dict) -> dict:
    """The keyed table of N keys: `bucketed` (change-log layout) or `plain` (merge mode's)."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    from bench.delta_common import PRIMARY_KEYS, schema, table_batches, table_files
    from uploader.delta_changes import buckets_of
    from uploader.delta_settings import BUCKET

    table_dir, keys, bucketed = Path(spec["table"]), spec["keys"], spec["layout"] == "bucketed"
    started = time.monotonic()
    settings = _settings(str(table_dir), change_log=True)
    if bucketed:
        def with_buckets():
            for batch in table_batches(keys, PARTITIONS):
                rows = pa.table(batch)
                yield from rows.append_column(BUCKET, buckets_of(rows, PRIMARY_KEYS, settings.buckets)).to_batches()
        out_schema = schema().append(pa.field(BUCKET, pa.int32()))
        reader = pa.RecordBatchReader.from_batches(out_schema, with_buckets())
        write_deltalake(str(table_dir), reader, partition_by=[BUCKET])
    else:
        write_deltalake(str(table_dir), pa.RecordBatchReader.from_batches(schema(), table_batches(keys, PARTITIONS)))
    files, size = table_files(table_dir)
    return {"build_s": round(time.monotonic() - started, 1), "table_files": files, "table_bytes": size,
            "version": DeltaTable(str(table_dir)).version()}


def child_files(spec: dict) -> dict:
    """The feed's micro-batches: updates only, uniform over the keys; a manifest of their files."""
    from bench.delta_common import micro_batch

    keys, count, rows_per_file = spec["keys"], spec["batches"], spec["rows_per_file"]
    started = time.monotonic()
    batches = []
    for b in range(count):
        files = micro_batch(Path(spec["dir"]) / f"batch{b:04d}", keys=keys, partitions=PARTITIONS, files=PARTITIONS,
                            rows_per_file=rows_per_file, update_share=1.0, batch=b, seed=5000 + b)
        batches.append([{"path": str(f.path), "partition": f.metadata.partition, "first": f.metadata.first_offset,
                         "last": f.metadata.last_offset, "bytes": f.path.stat().st_size} for f in files])
    manifest = {"keys": keys, "rows_per_file": rows_per_file, "batches": batches}
    Path(spec["manifest"]).write_text(json.dumps(manifest))
    return {"files_s": round(time.monotonic() - started, 1), "batches": count,
            "bytes_per_batch": sum(f["bytes"] for b in batches for f in b) / max(1, count)}


class _Compactor:
    """The driver's own background compactions (sink_service.driver.delta_compactions.BackgroundCompactions: woken
    after each batch, and every 10 s while idle), with each compaction timed."""

    def __init__(self, settings, scratch: Path, t0: float) -> None:
        from sink_service.driver.delta_compactions import BackgroundCompactions
        from sink_service.driver.metrics import SinkMetrics

        self.background = BackgroundCompactions(settings, scratch, SinkMetrics())
        self.t0 = t0
        self.runs: list[dict] = []
        self.errors: list[str] = []
        self.retries = 0
        compaction = self.background.compaction
        compact = compaction.compact

        def timed(topic, keys, order, on_retry=None, stop=None):
            sizes = compaction.sizes(topic)
            started = time.monotonic()
            try:
                totals = compact(topic, keys, order, on_retry=self._retried, stop=stop)
            except Exception as exc:  # recorded, then the driver's handling (retried after the next batch)
                self.errors.append(f"{type(exc).__name__}: {exc}"[:500])
                raise
            self.runs.append({"at_s": round(started - self.t0, 1), "s": round(time.monotonic() - started, 2),
                              "buckets": totals.get("buckets"), "rows": totals.get("rows"),
                              "changes_mb": round(sizes.changes / 1e6, 1) if sizes else None,
                              "table_mb": round(sizes.table / 1e6, 1) if sizes else None,
                              "rows_copied": totals.get("num_target_rows_copied"),
                              "rows_updated": totals.get("num_target_rows_updated")})
            return totals

        compaction.compact = timed

    def _retried(self, *_args) -> None:
        self.retries += 1

    def appended(self, files) -> None:
        """After a batch's commit, as the driver does."""
        self.background.appended([f.metadata for f in files])
        self.background.wake()

    def stop(self) -> None:
        self.background.stop(timeout_s=600)


def child_feed(spec: dict) -> dict:
    """The live feed: one batch every interval, applied when due; change-log mode with the background compaction."""
    from deltalake import DeltaTable

    from bench.delta_common import TOPIC, log_actions, max_rss_mb
    from uploader.delta import DeltaTarget
    from uploader.delta_changes import ChangeLogTarget

    table_dir, change_log, interval = Path(spec["table"]), spec["mode"] == "change-log", spec["interval"]
    manifest = json.loads(Path(spec["manifest"]).read_text())
    batches = _delta_files(manifest, spec["batches"])
    settings = _settings(str(table_dir), change_log)
    target = ChangeLogTarget(settings) if change_log else DeltaTarget(settings)
    changes_dir = Path(settings.changes_uri_for(TOPIC))
    keyed_before = DeltaTable(str(table_dir)).version()
    retries = []
    probe_app = settings.app_id(TOPIC, 0)

    def retried(error, attempt, wait) -> None:
        retries.append({"at_s": round(time.monotonic() - t0, 1), "reason": getattr(error, "reason", None)})

    rss_before = max_rss_mb()
    t0 = time.monotonic()
    compactor = _Compactor(settings, Path(spec["scratch"]), t0) if change_log else None
    out, stopped = [], None
    for b, files in enumerate(batches):
        due = t0 + (b + 1) * interval
        if (wait := due - time.monotonic()) > 0:
            time.sleep(wait)
        started = time.monotonic()
        if started - due > BEHIND_S:
            stopped = f"fell behind: batch {b} would start {started - due:.0f} s after it was due"
            break
        if spec.get("deadline_s") and started - t0 > spec["deadline_s"]:
            stopped = f"stopped at the {spec['deadline_s']:.0f} s budget after {b} batches"
            break
        details, attempts = target.merge(files, on_retry=retried)
        done = time.monotonic()
        if compactor:
            compactor.appended(files)
        last = files[0].metadata.last_offset + 1
        probe_uri = str(changes_dir) if change_log else str(table_dir)
        while DeltaTable(probe_uri).transaction_version(probe_app) != last:  # what a new reader's snapshot holds
            if time.monotonic() - done > 60:
                raise RuntimeError(f"batch {b}: partition 0's transaction is not {last} 60 s after the commit")
            time.sleep(0.05)
        visible = time.monotonic()
        out.append({"b": b, "late_s": round(started - due, 3), "append_s": round(done - started, 3),
                    "fresh_s": round(visible - due, 3), "attempts": attempts,
                    "maintenance": bool(details.get("maintenance"))})
    feed_s = time.monotonic() - t0
    rss_feed = max_rss_mb()
    if compactor:
        compactor.stop()
    actions = log_actions(table_dir, keyed_before)
    if change_log and changes_dir.exists():
        actions += [{**a, "table": "changes"} for a in log_actions(changes_dir, -1)]
    applied = len(out)
    update_bytes = sum(f["bytes"] for batch in manifest["batches"][:applied] for f in batch)
    return {"mode": spec["mode"], "batches": out, "applied": applied, "stopped": stopped, "feed_s": round(feed_s, 1),
            "records": applied * PARTITIONS * manifest["rows_per_file"], "update_bytes": update_bytes,
            "log": actions, "retries": retries, "peak_rss_mb": round(rss_feed, 1),
            "rss_before_feed_mb": round(rss_before, 1), "peak_rss_with_last_compaction_mb": round(max_rss_mb(), 1),
            "compactions": compactor.runs if compactor else [],
            "compaction_errors": compactor.errors if compactor else [],
            "compaction_retries": compactor.retries if compactor else 0,
            "keyed_dir_bytes": _dir_bytes(table_dir), "changes_dir_bytes": _dir_bytes(changes_dir)}


def _expected(manifest: dict, applied: int):
    """Per key id: the version (batch + 1) and amount of its latest update; version 0 = never updated."""
    import numpy as np
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    version = np.zeros(manifest["keys"], np.int32)
    amount = np.zeros(manifest["keys"], np.float64)
    for batch in manifest["batches"][:applied]:
        for f in batch:
            rows = pq.read_table(f["path"], columns=["id", "version", "amount"])
            ids = pc.cast(pc.utf8_slice_codeunits(rows["id"], 1), "int64").to_numpy()
            version[ids] = rows["version"].to_numpy()
            amount[ids] = rows["amount"].to_numpy()
    return version, amount


def _check(batches, version, amount) -> dict:
    """Every key once, with its latest version and (if updated) amount."""
    import numpy as np
    import pyarrow.compute as pc

    seen = np.zeros(len(version), np.int32)
    rows = wrong_version = wrong_amount = 0
    examples = []
    for batch in batches:
        ids = pc.cast(pc.utf8_slice_codeunits(batch.column("id"), 1), "int64").to_numpy()
        got_v = batch.column("version").to_numpy(zero_copy_only=False)
        got_a = batch.column("amount").to_numpy(zero_copy_only=False)
        rows += len(ids)
        np.add.at(seen, ids, 1)
        bad_v = got_v != version[ids]
        bad_a = (version[ids] > 0) & (got_a != amount[ids])
        wrong_version += int(bad_v.sum())
        wrong_amount += int(bad_a.sum())
        for i in np.flatnonzero(bad_v | bad_a)[: max(0, 5 - len(examples))]:
            examples.append({"id": int(ids[i]), "version": int(got_v[i]), "expected_version": int(version[ids[i]]),
                             "amount": float(got_a[i]), "expected_amount": float(amount[ids[i]])})
    return {"rows": rows, "missing": int((seen == 0).sum()), "duplicated": int((seen > 1).sum()),
            "wrong_version": wrong_version, "wrong_amount": wrong_amount, "examples": examples,
            "ok": rows == len(version) and not (seen != 1).any() and wrong_version == 0 and wrong_amount == 0}


def child_verify(spec: dict) -> dict:
    """The view, then (after a final compaction) the keyed table alone, against the feed's latest rows per key."""
    from deltalake import DeltaTable

    from bench.delta_common import ORDER, PRIMARY_KEYS, TOPIC
    from uploader.delta_compaction import Compaction
    from uploader.delta_view import current_batches

    manifest = json.loads(Path(spec["manifest"]).read_text())
    version, amount = _expected(manifest, spec["applied"])
    settings = _settings(spec["table"], change_log=spec["mode"] == "change-log")
    out = {}
    started = time.monotonic()
    if spec["mode"] == "change-log":
        pending = DeltaTable(settings.changes_uri_for(TOPIC)).to_pyarrow_dataset().count_rows()
        _, batches = current_batches(settings, TOPIC, PRIMARY_KEYS, ORDER)
        out["view"] = {**_check(batches, version, amount), "s": round(time.monotonic() - started, 1),
                       "change_log_rows": pending}
        started = time.monotonic()
        final = Compaction(settings, Path(spec["scratch"]), keep_applied_s=0).compact(TOPIC, PRIMARY_KEYS, ORDER)
        out["final_compaction"] = {"s": round(time.monotonic() - started, 1), "rows": final.get("rows"),
                                   "change_log_rows_after": DeltaTable(
                                       settings.changes_uri_for(TOPIC)).to_pyarrow_dataset().count_rows()}
        started = time.monotonic()
    out["table"] = {**_check(DeltaTable(spec["table"]).to_pyarrow_dataset().to_batches(), version, amount),
                    "s": round(time.monotonic() - started, 1)}
    return out


def child_scale(spec: dict) -> dict:
    """One instance of W: appends its partitions' files of every batch, one commit per batch, from spec['start']."""
    from bench.delta_common import max_rss_mb
    from uploader.delta_changes import ChangeLogTarget

    manifest = json.loads(Path(spec["manifest"]).read_text())
    w, writers = spec["writer"], spec["writers"]
    batches = [[f for f in files if f.metadata.partition % writers == w]
               for files in _delta_files(manifest, spec["batches"])]
    target = ChangeLogTarget(_settings(spec["table"], change_log=True))
    if spec.get("pin"):
        os.sched_setaffinity(0, {w % (os.cpu_count() or 1)})
    retries = []
    if (wait := spec["start"] - time.time()) > 0:
        time.sleep(wait)
    started = time.time()
    cpu0 = time.process_time()
    seconds = []
    for files in batches:
        t = time.monotonic()
        target.merge(files, on_retry=lambda e, a, s: retries.append(getattr(e, "reason", None)))
        seconds.append(round(time.monotonic() - t, 3))
    return {"started": started, "ended": time.time(), "records": sum(f.metadata.record_count for b in batches
                                                                      for f in b),
            "commits": len(batches), "retries": len(retries), "retry_reasons": sorted(set(map(str, retries))),
            "append_s": seconds, "cpu_s": round(time.process_time() - cpu0, 2), "peak_rss_mb": round(max_rss_mb(), 1)}


def child_scale_check(spec: dict) -> dict:
    from deltalake import DeltaTable

    from bench.delta_common import TOPIC

    manifest = json.loads(Path(spec["manifest"]).read_text())
    settings = _settings(spec["table"], change_log=True)
    changes = DeltaTable(settings.changes_uri_for(TOPIC))
    last = manifest["batches"][spec["batches"] - 1]
    held = {f["partition"]: changes.transaction_version(settings.app_id(TOPIC, f["partition"])) for f in last}
    expected_rows = spec["batches"] * PARTITIONS * manifest["rows_per_file"]
    rows = changes.to_pyarrow_dataset().count_rows()
    ok = rows == expected_rows and all(held[f["partition"]] == f["last"] + 1 for f in last)
    return {"change_log_rows": rows, "expected_rows": expected_rows, "transactions_ok": ok, "ok": ok}


STEPS = {"build": child_build, "files": child_files, "feed": child_feed, "verify": child_verify,
         "scale": child_scale, "scale_check": child_scale_check}


def start_child(step: str, spec: dict) -> subprocess.Popen:
    command = [sys.executable, "-m", "bench.delta_table_sizes", "--child", step, json.dumps(spec)]
    return subprocess.Popen(command, cwd=BENCH.parent, stdout=subprocess.PIPE, text=True)


def run_child(step: str, spec: dict, timeout_s: float) -> dict:
    """One step in a child process; its result, with the rest of the machine's load while it ran."""
    process = start_child(step, spec)
    sampler = ProcessTreeSampler(process.pid, ours={"benchmark": [os.getpid()]}).__enter__()
    try:
        out, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        sampler.stop()
        return {"error": f"{step} timed out after {timeout_s:.0f}s"}
    sampler.stop()
    if process.returncode != 0:
        return {"error": f"{step}: exit code {process.returncode}"}
    result = json.loads(out.strip().splitlines()[-1])
    result["sampled_peak_rss_mb"] = round(sampler.peak_rss / 2**20, 1)
    result["cpu_s"] = round(sampler.tree_cpu_s, 1)
    result["other_load_cores"] = round(sampler.other_cpu_s / sampler.wall_s, 2) if sampler.wall_s else None
    return result


# --- the driver -----------------------------------------------------------------------------------------

def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


def summarise(feed: dict, interval: float, build: dict) -> dict:
    """What a run shows: keeping up, times, freshness, bytes written per hour against the updates, bytes kept."""
    batches = feed["batches"]
    hours = max(feed["feed_s"], 1e-9) / 3600
    written = sum(a["bytes_added"] for a in feed["log"])
    by_kind: dict[str, int] = {}
    for a in feed["log"]:
        kind = f"{a.get('table', 'keyed')} {a['operation']}"
        by_kind[kind] = by_kind.get(kind, 0) + a["bytes_added"]
    late = [b["late_s"] for b in batches]
    third = max(1, len(late) // 3)
    on_disk = feed["keyed_dir_bytes"] + feed["changes_dir_bytes"]
    grown = on_disk - build["table_bytes"]
    comp = [c["s"] for c in feed["compactions"]]
    return {
        "batches": len(batches), "records": feed["records"], "feed_s": feed["feed_s"],
        "kept_up": not feed["stopped"] and all(b["late_s"] + b["append_s"] <= interval for b in batches[1:]),
        "max_late_s": max(late, default=None), "late_first_third_s": round(statistics.mean(late[:third]), 2)
        if late else None, "late_last_third_s": round(statistics.mean(late[-third:]), 2) if late else None,
        "append_p50_s": _pct([b["append_s"] for b in batches], 0.5),
        "append_p99_s": _pct([b["append_s"] for b in batches], 0.99),
        "append_max_s": max((b["append_s"] for b in batches), default=None),
        "fresh_p50_s": _pct([b["fresh_s"] for b in batches], 0.5),
        "fresh_p99_s": _pct([b["fresh_s"] for b in batches], 0.99),
        "fresh_max_s": max((b["fresh_s"] for b in batches), default=None),
        "compactions": len(comp), "compaction_p50_s": _pct(comp, 0.5), "compaction_max_s": max(comp, default=None),
        "compaction_busy_share": round(sum(comp) / max(feed["feed_s"], 1e-9), 2),
        "written_mb": round(written / 1e6, 1), "update_mb": round(feed["update_bytes"] / 1e6, 1),
        "written_gb_per_h": round(written / 1e9 / hours, 2),
        "update_gb_per_h": round(feed["update_bytes"] / 1e9 / hours, 2),
        "written_ratio": round(written / feed["update_bytes"], 2) if feed["update_bytes"] else None,
        "written_mb_by_kind": {k: round(v / 1e6, 1) for k, v in sorted(by_kind.items())},
        "on_disk_mb": round(on_disk / 1e6, 1), "grown_mb": round(grown / 1e6, 1),
        "retained_gb_at_168h": round((build["table_bytes"] + grown / hours * 168) / 1e9, 1),
        "peak_rss_mb": feed["peak_rss_mb"], "retries": len(feed["retries"]),
    }


def run_scaling(base: Path, manifest: Path, batches: int, writers_list: list[int], timeout: float,
                pin: bool = False) -> list[dict]:
    out = []
    for writers in writers_list:
        table = WORK / f"scale_{writers}"
        shutil.rmtree(table, ignore_errors=True)
        shutil.rmtree(Path(str(table) + "__changes"), ignore_errors=True)
        shutil.copytree(base, table)
        start = time.time() + 8  # both imported and ready before the clock starts
        spec = {"table": str(table), "manifest": str(manifest), "batches": batches, "writers": writers,
                "start": start, "pin": pin}
        sampler_ps = [start_child("scale", {**spec, "writer": w}) for w in range(writers)]
        sampler = ProcessTreeSampler(os.getpid()).__enter__()
        results = []
        for p in sampler_ps:
            stdout, _ = p.communicate(timeout=timeout)
            results.append(json.loads(stdout.strip().splitlines()[-1]) if p.returncode == 0
                           else {"error": f"exit code {p.returncode}"})
        sampler.stop()
        case: dict = {"writers": writers, "pinned": pin, "instances": results,
                      "other_load_cores": round(sampler.other_cpu_s / sampler.wall_s, 2) if sampler.wall_s else None}
        if not any("error" in r for r in results):
            wall = max(r["ended"] for r in results) - min(r["started"] for r in results)
            records = sum(r["records"] for r in results)
            case.update(records=records, wall_s=round(wall, 2), records_per_s=round(records / wall),
                        cores=round(sum(r["cpu_s"] for r in results) / wall, 2),
                        retries=sum(r["retries"] for r in results), commits=sum(r["commits"] for r in results),
                        check=run_child("scale_check", spec, timeout))
        out.append(case)
        summary = {k: v for k, v in case.items() if k != "instances"}
        log(f"scaling x{writers}{' pinned' if pin else ''}: " + json.dumps(summary))
        shutil.rmtree(table, ignore_errors=True)
        shutil.rmtree(Path(str(table) + "__changes"), ignore_errors=True)
    if len(out) >= 2 and out[0].get("records_per_s") and out[1].get("records_per_s"):
        out[1]["speedup"] = round(out[1]["records_per_s"] / out[0]["records_per_s"], 2)
    return out


def _order(item: tuple[str, dict]) -> tuple[int, str]:
    return int(item[0].split()[0]), item[0]


def _label(key: str) -> str:
    """A size's key in the report: N, or N and a tag (`--tag`: a run of other code or settings)."""
    number, _, tag = key.partition(" ")
    return f"{int(number):,}" + (f" ({tag})" if tag else "")


def markdown(report: dict) -> str:
    lines = [f"## Delta tables of 100k to 10M keys, live (issue #40; {report['updated_at']})", "",
             f"Machine: {report['machine']}. Feed: {report['settings']['rate']:,} records/s, a micro-batch of "
             f"{PARTITIONS} files every {report['settings']['interval']} s, every row an update of a uniformly drawn "
             "key; change-log mode with the default settings (16 buckets, compact at 0.30, max interval 600 s). "
             "`late`: batch start - due (first / last third of the run); fresh: due -> visible to a new reader; "
             "written/h and ratio: Parquet bytes added to both tables per hour and over the updates' Parquet bytes; "
             "retained at 168 h: table + growth per hour x 168 (no vacuum in the run).", "",
             "| keys | mode | table MB | batches (min) | kept up | late first/last s | append p50/p99/max s | "
             "fresh p50/p99 s | compactions: n, p50/max s, busy | written GB/h (x updates) | retained at 168 h GB | "
             "peak RSS MB | view check | other load |",
             "|---:|---|---:|---|---|---|---|---|---|---|---:|---:|---|---:|"]
    for label, case in sorted(report["sizes"].items(), key=_order):
        keys = _label(label)
        for mode in ("change-log", "merge"):
            run = case.get(mode)
            if not run:
                continue
            if run.get("error"):
                lines.append(f"| {keys} | {mode} | | failed: {run['error']} |||||||||||")
                continue
            s, build = run["summary"], case["build_" + ("bucketed" if mode == "change-log" else "plain")]
            check = run.get("verify", {})
            view = check.get("view") or check.get("table") or {}
            comp = (f"{s['compactions']}, {s['compaction_p50_s']}/{s['compaction_max_s']}, "
                    f"{s['compaction_busy_share']:.0%}" if s["compactions"] else "-")
            lines.append(
                f"| {keys} | {mode} | {build['table_bytes'] / 1e6:,.0f} | {s['batches']} "
                f"({s['feed_s'] / 60:.1f}) | {'yes' if s['kept_up'] else 'NO'} | {s['late_first_third_s']}/"
                f"{s['late_last_third_s']} | {s['append_p50_s']}/{s['append_p99_s']}/{s['append_max_s']} | "
                f"{s['fresh_p50_s']}/{s['fresh_p99_s']} | {comp} | {s['written_gb_per_h']} "
                f"({s['written_ratio']}x) | {s['retained_gb_at_168h']} | {s['peak_rss_mb']:,.0f} | "
                f"{('ok' if view.get('ok') else 'WRONG') if view else '-'} | {run.get('other_load_cores')} |")
    lines += ["", "Bytes written by commit kind (MB), and the compactions (s, rows, change log MB / keyed table MB "
              "when due):", ""]
    for label, case in sorted(report["sizes"].items(), key=_order):
        keys = _label(label)
        run = case.get("change-log") or {}
        if "summary" in run:
            kinds = ", ".join(f"{k} {v:,.0f}" for k, v in run["summary"]["written_mb_by_kind"].items() if v)
            comps = "; ".join(f"{c['s']} s, {c['rows'] or 0:,}, {c['changes_mb']}/{c['table_mb']}"
                              for c in run["compactions"][:12])
            more = f" (+{len(run['compactions']) - 12} more)" if len(run["compactions"]) > 12 else ""
            lines.append(f"- {keys} keys: {kinds}. Compactions: {comps}{more}.")
    if report.get("scaling"):
        lines += ["", "Instance scaling (appends to one change log, as fast as they go, no compaction):", "",
                  "| instances | records | s | records/s | speedup | cores used | commits | retried | check |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
        for c in report["scaling"]["cases"]:
            name = f"{c['writers']}{', a core each' if c.get('pinned') else ''}"
            if "records_per_s" not in c:
                lines.append(f"| {name} | failed: {c['instances']} |||||||")
                continue
            lines.append(f"| {name} | {c['records']:,} | {c['wall_s']} | {c['records_per_s']:,} | "
                         f"{c.get('speedup', '')} | {c.get('cores', '')} | {c['commits']} | {c['retries']} | "
                         f"{'ok' if c['check'].get('ok') else c['check']} |")
        lines.append(f"\n(keys: {report['scaling']['keys']:,}; rows per file: "
                     f"{report['scaling'].get('rows_per_file', 12_500):,}; other load, cores: "
                     f"{[c.get('other_load_cores') for c in report['scaling']['cases']]})")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", nargs=2, metavar=("STEP", "SPEC"), help=argparse.SUPPRESS)
    parser.add_argument("--keys", default="100000,1000000,10000000", help="comma list of table sizes (keys)")
    parser.add_argument("--minutes", type=float, default=5, help="change-log feed length, minutes of real time")
    parser.add_argument("--merge-minutes", type=float, default=None, help="merge-mode feed length (default --minutes)")
    parser.add_argument("--merge-batches", default="10000000:3",
                        help="keys:batches caps of the merge-mode feed (comma list); 'none' for no merge mode")
    parser.add_argument("--rate", type=int, default=20_000, help="records per second")
    parser.add_argument("--interval", type=int, default=5, help="seconds between micro-batches")
    parser.add_argument("--scaling-batches", type=int, default=12, help="batches appended in the scaling run (0: none)")
    parser.add_argument("--scaling-pin", action="store_true", help="also run the scaling with a core per instance")
    parser.add_argument("--scaling-rows-per-file", type=int, default=None,
                        help="rows per file (partition range) in the scaling run; default: the feed's (rate x "
                             "interval / 8, the live shape); 100000 is SINK_FLUSH_RECORDS, a range of an instance "
                             "that is behind")
    parser.add_argument("--scaling-keys", type=int, default=None, help="table size of the scaling run (default: "
                        "the largest size of --keys)")
    parser.add_argument("--no-final-check", action="store_true", help="skip the view/table check")
    parser.add_argument("--out", type=Path, default=RESULTS, help="directory for delta_table_sizes.{json,md}")
    parser.add_argument("--render", action="store_true", help="only rewrite the .md from the .json")
    parser.add_argument("--tag", default="", help="kept beside the size in the report (a run of other code/settings)")
    args = parser.parse_args(argv)
    if args.render:
        report = json.loads((args.out / "delta_table_sizes.json").read_text())
        (args.out / "delta_table_sizes.md").write_text(markdown(report))
        print(markdown(report))
        return 0
    if args.child:
        step, spec = args.child[0], json.loads(args.child[1])
        print(json.dumps(STEPS[step](spec)))
        return 0
    sizes = [int(k) for k in args.keys.split(",") if k.strip()]
    caps = {} if args.merge_batches == "none" else {
        int(k): int(v) for k, v in (x.split(":") for x in args.merge_batches.split(",") if x.strip())}
    scaling_keys = args.scaling_keys or max(sizes)
    out_json = args.out / "delta_table_sizes.json"
    report = json.loads(out_json.read_text()) if out_json.exists() else {"sizes": {}}
    report.update(updated_at=time.strftime("%Y-%m-%d %H:%M %Z"), machine=machine_info(),
                  settings={"rate": args.rate, "interval": args.interval, "partitions": PARTITIONS})
    rows_per_file = args.rate * args.interval // PARTITIONS
    scaling_rows = args.scaling_rows_per_file or rows_per_file
    cl_batches = int(args.minutes * 60 / args.interval)
    mm_batches = int((args.merge_minutes if args.merge_minutes is not None else args.minutes) * 60 / args.interval)

    def save() -> None:
        args.out.mkdir(parents=True, exist_ok=True)
        out_json.write_text(json.dumps(report, indent=1))
        (args.out / "delta_table_sizes.md").write_text(markdown(report))

    shutil.rmtree(WORK, ignore_errors=True)
    for keys in sizes:
        work = WORK / str(keys)
        work.mkdir(parents=True, exist_ok=True)
        case: dict = {"keys": keys, "started_at": time.strftime("%Y-%m-%d %H:%M %Z"), "minutes": args.minutes}
        report["sizes"][f"{keys} {args.tag}".strip()] = case
        timeout = 1800 + keys / 5000
        manifest = work / "manifest.json"
        want_merge = args.merge_batches != "none"
        batches_needed = max(cl_batches, min(mm_batches, caps.get(keys, mm_batches)) if want_merge else 0,
                             args.scaling_batches if keys == scaling_keys and scaling_rows == rows_per_file else 0)
        log(f"{keys:,} keys: {batches_needed} micro-batches of {rows_per_file * PARTITIONS:,} rows")
        case["files"] = run_child("files", {"keys": keys, "batches": batches_needed, "rows_per_file": rows_per_file,
                                            "dir": str(work / "files"), "manifest": str(manifest)}, timeout)
        layouts = ("bucketed", "plain") if want_merge else ("bucketed",)
        for layout in layouts:
            case["build_" + layout] = run_child("build", {"table": str(work / f"base_{layout}"), "keys": keys,
                                                          "layout": layout}, timeout)
            log(f"  build {layout}: {case['build_' + layout]}")
        if "error" in case["build_bucketed"] or "error" in case["files"]:
            save()
            continue
        if keys == scaling_keys and args.scaling_batches:
            scaling_manifest = manifest
            if scaling_rows != rows_per_file:
                scaling_manifest = work / "scaling_manifest.json"
                run_child("files", {"keys": keys, "batches": args.scaling_batches,
                                    "rows_per_file": scaling_rows, "dir": str(work / "scaling_files"),
                                    "manifest": str(scaling_manifest)}, timeout)
            cases = [c for pin in ((False, True) if args.scaling_pin else (False,))
                     for c in run_scaling(work / "base_bucketed", scaling_manifest, args.scaling_batches, [1, 2],
                                          timeout, pin)]
            report["scaling"] = {"keys": keys, "batches": args.scaling_batches, "cases": cases,
                                 "rows_per_file": scaling_rows}
            save()
        runs = [("change-log", "bucketed", cl_batches, None)]
        if want_merge and "error" not in case["build_plain"]:
            runs.append(("merge", "plain", min(mm_batches, caps.get(keys, mm_batches)), None))
        for mode, layout, count, deadline in runs:
            table = work / f"{mode}_table"
            shutil.copytree(work / f"base_{layout}", table)
            spec = {"table": str(table), "manifest": str(manifest), "mode": mode, "batches": count,
                    "interval": args.interval, "scratch": str(work / "scratch"), "deadline_s": deadline}
            log(f"  feed {mode}: {count} batches")
            run = run_child("feed", spec, timeout + count * args.interval)
            if not run.get("error"):
                run["summary"] = summarise(run, args.interval, case["build_" + layout])
                log(f"  {mode}: " + json.dumps(run["summary"]))
                if run.get("compaction_errors"):
                    log(f"  compaction errors: {run['compaction_errors'][:3]}")
                if not args.no_final_check:
                    run["verify"] = run_child("verify", {**spec, "applied": run["applied"]}, timeout)
                    log(f"  verify: {json.dumps(run['verify'])[:600]}")
            else:
                log(f"  {mode} failed: {run['error']}")
            case[mode] = run
            save()
            shutil.rmtree(table, ignore_errors=True)
            shutil.rmtree(Path(str(table) + "__changes"), ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    save()
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
