"""Benchmark the sink service side by side with Pathway, Quix Streams FileSink and a hand-written pipeline.

    .venv/bin/python -m bench.run [--records 2000000] [--partitions 8] [--sweep partitions|record-size|backlog]
    .venv/bin/python -m bench.run --live-rates 20000,80000 [--live-seconds 60]

Starts a local broker (noida-db) and the local EMS-compatible endpoint once, produces the workload once, then
runs each system in turn against it, each with its own consumer group, until every partition's committed
offset equals its end offset (Pathway: until its output file holds every record), and stops it. Writes
bench/results/results.{json,md,png} (a sweep writes bench/results/sweep_<name>.*, the live mode
bench/results/live.*). Scratch data goes to bench/results/tmp/.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path

import psutil
from confluent_kafka import libversion

from bench import report
from bench.endpoint import EndpointProcess, endpoint_process
from bench.live import run_live
from bench.measure import ProcessTreeSampler, latency_stats, machine_info, wait_until_quiet
from bench.systems import (
    BENCH,
    DEFAULT_SYSTEMS,
    DEFAULT_TRANSFORM_SQL,
    PATHWAY_VENV,
    QUIX_VENV,
    SYSTEMS,
    Output,
    RunContext,
    System,
)
from bench.workload import Produced, WorkloadSpec, build_records, produce, produce_trailers
from devkit.brokers import broker_kind, reported_ends_need_trailers, running_broker
from devkit.kafka_data import create_topics, end_offsets
from sink_service.startup.java_home import resolve_java

AUTHORIZATION = "AppKey bench-key"
RESULTS = BENCH / "results"
VENVS = {  # peers with dependencies that clash with the project's: each gets its own virtualenv
    "quix": (QUIX_VENV, BENCH / "requirements-quix.txt"),  # quixstreams pins confluent-kafka<2.13
    "pathway": (PATHWAY_VENV, BENCH / "requirements-pathway.txt"),  # its own pyarrow, rdkafka, ~50 packages
}
SWEEPS = {"partitions": (1, 4, 16), "record-size": (100, 1000, 10_000), "backlog": (1_000_000, 4_000_000)}
BACKLOG_THRESHOLDS = (250_000, 10_000)  # default --flush-records, --flush-interval-ms of a backlog run
LIVE_THRESHOLDS = (100_000, 5_000)  # ... of a live run: 5 s or 100,000 records per partition


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


def ensure_venv(venv: Path, requirements: Path) -> Path:
    """A peer's own virtualenv from its requirements file, (re)installed when the file changes."""
    python = venv / "bin" / "python"
    digest = hashlib.sha256(requirements.read_bytes()).hexdigest()[:16]
    stamp = venv / f".installed-{digest}"
    if stamp.exists() and python.exists():
        return python
    log(f"creating {venv.relative_to(BENCH.parent)} from {requirements.name} (one-off)")
    if not python.exists():
        base = getattr(sys, "_base_executable", None) or shutil.which("python3") or "python3"
        subprocess.run([base, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "-r", str(requirements)], check=True)
    for old in venv.glob(".installed-*"):
        old.unlink()
    stamp.touch()
    return python


def peer_versions(venv: Path, packages: tuple[str, ...]) -> dict[str, str]:
    script = (f"import importlib.metadata as m, json; print(json.dumps({{p: m.version(p) for p in {packages!r}}}))")
    try:
        return json.loads(subprocess.run([str(venv / "bin" / "python"), "-c", script], capture_output=True,
                                         text=True, check=True, timeout=60).stdout)
    except (OSError, subprocess.SubprocessError, ValueError):
        return {}


def versions(systems: list[str]) -> dict[str, str]:
    found = {"python": sys.version.split()[0]}
    for package in ("pyspark", "pyarrow", "confluent-kafka", "noida-db", "numpy"):
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[package] = "absent"
    found["librdkafka"] = libversion()[0]
    try:
        java = subprocess.run([resolve_java(), "-version"], capture_output=True, text=True, timeout=30).stderr
        found["java"] = java.splitlines()[0].split('"')[1] if '"' in java else java.strip()[:40]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        found["java"] = "?"
    if "quix" in systems:
        quix = peer_versions(QUIX_VENV, ("quixstreams", "confluent-kafka", "pyarrow"))
        found["quixstreams"] = quix.get("quixstreams", "?")
        found["quix venv confluent-kafka"] = quix.get("confluent-kafka", "?")
        found["quix venv pyarrow"] = quix.get("pyarrow", "?")
    if "pathway" in systems:
        found["pathway"] = peer_versions(PATHWAY_VENV, ("pathway",)).get("pathway", "?")
    return found


def produce_workload(bootstrap: str, spec: WorkloadSpec, topic: str, trailers: bool = False) -> Produced:
    """The workload in `topic`; with `trailers` one more record per partition, so the reported end offsets
    are the true ones (`produce_trailers`)."""
    create_topics(bootstrap, {topic: spec.partitions})
    log(f"building {spec.records:,} records of {spec.record_size} B over {spec.keys:,} keys")
    keys, values = build_records(spec)
    key_bytes, value_bytes = sum(map(len, keys)), sum(map(len, values))
    log(f"producing to {topic} ({spec.partitions} partitions)")
    seconds = produce(bootstrap, topic, keys, values)
    del keys, values
    gc.collect()
    records = spec.records
    added = produce_trailers(bootstrap, topic, spec.partitions, spec.record_size) if trailers else None
    if added is not None:
        records, key_bytes, value_bytes = (records + added.records, key_bytes + added.key_bytes,
                                           value_bytes + added.value_bytes)
    ends = end_offsets(bootstrap, topic, spec.partitions)
    if sum(ends.values()) != records or (added is not None and ends != added.ends):
        raise RuntimeError(f"end offsets {ends} do not add up to {records} records")
    log(f"produced {records:,} records in {seconds:.1f}s ({records / seconds:,.0f}/s)")
    return Produced(topic, records, key_bytes, value_bytes, seconds, ends)


def run_system(system: System, ctx: RunContext, produced: Produced, endpoint: EndpointProcess, group: str,
               timeout_s: float, stall_s: float, broker_pids: list[int]) -> dict:
    result: dict = {"label": system.label, "group": group, "pushes_to_endpoint": system.pushes_to_endpoint}
    load_before = os.getloadavg()[0]
    started, started_wall = time.monotonic(), time.time()
    system.start(ctx, group)
    watcher = system.watcher(ctx, group, produced.end_offsets)
    sampler = ProcessTreeSampler(system.pid, ours={"endpoint": [endpoint.pid], "harness": [os.getpid()],
                                                      "broker": broker_pids}).__enter__()
    try:
        timeline = watcher.wait_until_done(started, timeout_s, system.alive, stall_s)
        result.update(system.before_stop())
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
        timeline = None
    finally:
        sampler.stop()
        stop_started = time.monotonic()
        result["exit_code"] = system.stop()
        result["stop_s"] = round(time.monotonic() - stop_started, 2)
    if timeline is None:
        result["log_tail"] = system.log_path.read_text(errors="replace")[-3000:]
        log(f"{system.name} FAILED: {result['error']}\n{result['log_tail']}")
        return result
    out: Output = system.output(ctx, endpoint)
    total, mb = produced.records, produced.payload_bytes / 1e6
    wall = timeline.last_commit_s
    result.update({
        "records": total,
        "records_per_s": total / wall,
        "mb_per_s": mb / wall,
        "first_commit_s": timeline.first_commit_s,
        "last_commit_s": wall,
        "first_commit_records": timeline.first_commit_records,
        "after_first_commit_records_per_s": None,
        "after_first_commit_mb_per_s": None,
        "peak_rss_mb": sampler.peak_rss / 2**20,
        "peak_processes": sampler.peak_processes,
        "cpu_s": sampler.tree_cpu_s,
        "cpu_s_per_m_records": sampler.tree_cpu_s / (total / 1e6),
        "cpu_s_by_process_kind": sampler.cpu_s_by_kind,
        "peak_rss_mb_by_process_kind": {kind: round(rss / 2**20) for kind, rss in sampler.peak_rss_by_kind.items()},
        "endpoint_cpu_s": sampler.ours_cpu_s["endpoint"],
        "harness_cpu_s": sampler.ours_cpu_s["harness"],
        "broker_cpu_s": sampler.ours_cpu_s["broker"],
        "other_load_cores": sampler.other_cpu_s / sampler.wall_s if sampler.wall_s else None,
        "steal_cores": sampler.steal_cpu_s / sampler.wall_s if sampler.wall_s else None,
        "load_average_before": load_before,
        "files": out.files,
        "mean_file_mb": out.bytes / out.files / 2**20 if out.files else None,
        "rows_in_files": out.rows,
        "endpoint_rows": endpoint.count(system.target) if system.pushes_to_endpoint else None,
        "timeline": [[round(t, 2), n] for t, n in timeline.points],
    })
    remaining = total - timeline.first_commit_records
    if remaining > 0 and wall > timeline.first_commit_s:
        span = wall - timeline.first_commit_s
        result["after_first_commit_records_per_s"] = remaining / span
        result["after_first_commit_mb_per_s"] = mb * remaining / total / span
    if hasattr(system, "phases"):
        result["phases"] = system.phases(started_wall)
    latency = latency_stats(out.upload_s, out.produced_ms, started_wall)
    if not getattr(system, "timestamps_known", True):  # only latency from the start is known
        latency = {k: v for k, v in latency.items() if not k.startswith("raw_")}
    result["latency"] = latency
    result["latency_p50_s"], result["latency_p99_s"] = latency.get("p50_s"), latency.get("p99_s")
    log(f"{system.name}: {total / wall:,.0f} records/s, first commit {timeline.first_commit_s:.1f}s, "
        f"last {wall:.1f}s, peak RSS {result['peak_rss_mb']:,.0f} MB, {out.files} files, "
        f"other load {result['other_load_cores'] or 0:.2f} cores, steal {result['steal_cores'] or 0:.2f} cores")
    return result


def run_context(args, bootstrap: str, endpoint: EndpointProcess, topic: str, workdir: Path) -> RunContext:
    return RunContext(bootstrap, topic, args.partitions, endpoint.items_url(), AUTHORIZATION, workdir,
                      args.flush_records, args.flush_interval_ms, args.max_files_per_batch, dict(args.service_env),
                      args.pathway_autocommit_ms, bool(args.live_rates) or args.pathway_metadata, args.transform_sql)


def run_workload(bootstrap: str, endpoint: EndpointProcess, spec: WorkloadSpec, args, work: Path,
                 stamp: str, broker_pids: list[int]) -> dict:
    topic = f"bench_{spec.records}r_{spec.partitions}p_{spec.record_size}b_{stamp}"
    produced = produce_workload(bootstrap, spec, topic, trailers=reported_ends_need_trailers(args.broker))
    workdir = work / topic
    workdir.mkdir(parents=True)
    # A backlog smaller than --flush-records per partition would be flushed by the timer, not by size, and the
    # run would measure --flush-interval-ms: cap the threshold at the largest partition (1M records over 8
    # partitions: 125,000, one file per partition, as 250,000 gives at 2M).
    flush_records = min(args.flush_records, max(produced.end_offsets.values()))
    ctx = replace(run_context(args, bootstrap, endpoint, topic, workdir), partitions=spec.partitions,
                  flush_records=flush_records)
    run = {"workload": spec.as_dict(), "topic": topic, "records": produced.records, "produce_s": produced.seconds,
           "payload_bytes": produced.payload_bytes, "end_offsets": produced.end_offsets,
           "flush_records": flush_records, "systems": {}}
    for name in args.systems:
        waited, busy = wait_until_quiet(args.quiet_cores, args.settle_timeout)
        log(f"running {name} (after {waited:.0f}s of rest; machine busy {busy:.2f} cores)")
        try:
            run["systems"][name] = run_system(SYSTEMS[name](), ctx, produced, endpoint, f"bench-{name}-{topic}",
                                              args.timeout, args.stall_timeout, broker_pids)
            run["systems"][name].update(rested_s=round(waited, 1), busy_cores_before=round(busy, 2))
        except Exception as exc:  # a broken system must not lose the others' numbers
            traceback.print_exc()
            run["systems"][name] = {"label": SYSTEMS[name].label, "error": f"{type(exc).__name__}: {exc}"}
        gc.collect()
    run["ratios"] = report.ratios(run["systems"])
    return run


def stop_leftovers(processes: list[psutil.Process]) -> None:
    """running_broker() stops the noida-db launcher; the server it started can outlive it: stop it by PID."""
    alive = [p for p in processes if p.is_running()]
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, still = psutil.wait_procs(alive, timeout=10)
    for p in still:
        with contextlib.suppress(psutil.Error):
            p.kill()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--keys", type=int, default=200_000, help="distinct keys (records/keys updates each)")
    parser.add_argument("--record-size", type=int, default=130, help="bytes per JSON value")
    parser.add_argument("--flush-records", type=int, default=None,
                        help="records per file: SINK_FLUSH_RECORDS, the hand-written threshold, and Quix "
                             "checkpoints of flush-records x partitions records (default: 250,000; live: 100,000)")
    parser.add_argument("--flush-interval-ms", type=int, default=None,
                        help="SINK_FLUSH_INTERVAL_MS, the hand-written interval and Quix's commit interval "
                             "(default: 10,000; live: 5,000, also Pathway's autocommit_duration_ms there)")
    parser.add_argument("--pathway-autocommit-ms", type=int, default=None,
                        help="Pathway's autocommit_duration_ms, the longest time read data waits before it goes "
                             "through its engine into the file (default: Pathway's 1,500 in a backlog run, "
                             "--flush-interval-ms in a live run)")
    parser.add_argument("--pathway-metadata", action="store_true",
                        help="backlog run: read with Pathway's `_metadata` column too (always on in live mode, "
                             "where latency needs the Kafka timestamps)")
    parser.add_argument("--transform-sql", default=DEFAULT_TRANSFORM_SQL,
                        help="SINK_TRANSFORM_SQL of the opt-in system service+sql")
    parser.add_argument("--max-files-per-batch", type=int, default=None,
                        help="SINK_MAX_FILES_PER_BATCH (default: the service's own default)")
    parser.add_argument("--service-env", action="append", default=[], metavar="SINK_X=VALUE",
                        help="extra environment for the service, e.g. SINK_POLL_INTERVAL_MS=500 (repeatable)")
    parser.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS),
                        help=f"comma list, run in this order; one of {', '.join(SYSTEMS)} "
                             "(service+sql is opt-in: it needs SINK_TRANSFORM_SQL in the service)")
    parser.add_argument("--sweep", choices=sorted(SWEEPS), help="run the workload at several values of one "
                                                                 "parameter instead of once")
    parser.add_argument("--sweep-bytes", type=int, default=500_000_000,
                        help="record-size sweep: records = min(--records, this / record size)")
    parser.add_argument("--live-rate", type=int, action="append", default=[], metavar="RECORDS_PER_S",
                        help="live mode: produce at this rate while each system runs (repeatable)")
    parser.add_argument("--live-rates", default="", metavar="R1,R2", help="live mode: a comma list of rates")
    parser.add_argument("--live-seconds", type=float, default=60, help="live mode: seconds of producing per system")
    parser.add_argument("--live-retention-s", type=float, default=0,
                        help="live mode: the topic's retention.ms in seconds (0: the broker's default); for runs "
                             "longer than the broker can hold in memory (noida-db: about 30M records of 130 B)")
    parser.add_argument("--live-ready-timeout", type=float, default=120,
                        help="live mode: start producing after this long even if the system does not look ready")
    parser.add_argument("--live-settle", type=float, default=3,
                        help="live mode: seconds between the system looking ready and the first record")
    parser.add_argument("--timeout", type=float, default=900, help="seconds one system may take")
    parser.add_argument("--stall-timeout", type=float, default=300,
                        help="give a system up when nothing new was committed for this many seconds")
    parser.add_argument("--quiet-cores", type=float, default=0.1,
                        help="before each system, wait until the machine's busy CPU stays below this many cores "
                             "for 2 s (the broker keeps working after a produce)")
    parser.add_argument("--settle-timeout", type=float, default=120,
                        help="start the next system anyway after this many seconds of waiting for quiet")
    parser.add_argument("--broker", default=None, help="noida (default), tansu or external (SINK_TEST_BOOTSTRAP)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="directory for the report")
    args = parser.parse_args(argv)
    args.live_rates = [*args.live_rate, *(int(r) for r in args.live_rates.split(",") if r.strip())]
    if args.live_rates and args.sweep:
        parser.error("--sweep and the live mode (--live-rate/--live-rates) do not combine")
    records, interval = LIVE_THRESHOLDS if args.live_rates else BACKLOG_THRESHOLDS
    args.flush_records = args.flush_records or records
    args.flush_interval_ms = args.flush_interval_ms or interval
    if args.pathway_autocommit_ms is None:
        args.pathway_autocommit_ms = args.flush_interval_ms if args.live_rates else 1500
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in args.systems if s not in SYSTEMS]
    if unknown:
        parser.error(f"unknown system(s) {unknown}; choose from {sorted(SYSTEMS)}")
    env = {}
    for item in args.service_env:
        name, sep, value = item.partition("=")
        if not sep or not name.startswith("SINK_"):
            parser.error(f"--service-env wants SINK_NAME=VALUE, got {item!r}")
        env[name] = value
    args.service_env = env
    return args


def plan(args) -> list[tuple[object, WorkloadSpec]]:
    base = WorkloadSpec(args.records, args.partitions, min(args.keys, args.records), args.record_size)
    if args.sweep is None:
        return [(None, base)]
    if args.sweep == "partitions":
        return [(p, replace(base, partitions=p)) for p in SWEEPS["partitions"]]
    if args.sweep == "record-size":
        points = []
        for size in SWEEPS["record-size"]:
            records = min(args.records, args.sweep_bytes // size)
            points.append((size, replace(base, records=records, record_size=size,
                                         keys=min(base.keys, max(1, records // 10)))))
        return points
    return [(n, replace(base, records=n, keys=min(base.keys, n))) for n in SWEEPS["backlog"]]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for name, (venv, requirements) in VENVS.items():
        if name in args.systems:
            ensure_venv(venv, requirements)
    stamp = time.strftime("%Y%m%d%H%M%S")
    work = RESULTS / "tmp" / "latest"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    result = {
        "started_at": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "settings": {"flush_records": args.flush_records, "flush_interval_ms": args.flush_interval_ms,
                     "max_files_per_batch": args.max_files_per_batch or "service default",
                     "service_env": args.service_env or None, "systems": ",".join(args.systems),
                     "pathway_autocommit_ms": args.pathway_autocommit_ms,
                     "pathway_metadata": bool(args.live_rates) or args.pathway_metadata,
                     "transform_sql": args.transform_sql if "service+sql" in args.systems else None,
                     "broker": broker_kind(args.broker)},
        "environment": {"machine": machine_info(), "versions": versions(args.systems)},
        "sweep": args.sweep,
        "mode": "live" if args.live_rates else "backlog",
        "runs": [],
    }
    log(f"machine: {result['environment']['machine']}; versions: {result['environment']['versions']}")
    started = time.monotonic()
    broker: list[psutil.Process] = []
    try:
        with running_broker(args.broker) as bootstrap:
            broker = psutil.Process().children(recursive=True)  # the broker (a launcher and its server)
            broker_pids = [p.pid for p in broker]
            with endpoint_process(work / "ems", AUTHORIZATION) as endpoint:
                if args.live_rates:
                    result["settings"].update(live_seconds=args.live_seconds, live_retention_s=args.live_retention_s)
                    result["runs"] = run_live(bootstrap, endpoint, args, work, stamp, broker_pids,
                                              lambda topic, workdir: run_context(args, bootstrap, endpoint, topic,
                                                                                 workdir))
                for value, spec in plan(args) if not args.live_rates else ():
                    run = run_workload(bootstrap, endpoint, spec, args, work, stamp, broker_pids)
                    run["sweep_value"] = value
                    result["runs"].append(run)
    finally:
        stop_leftovers(broker)
    result["total_s"] = time.monotonic() - started
    stem = "live" if args.live_rates else "results" if args.sweep is None else f"sweep_{args.sweep.replace('-', '_')}"
    paths = report.write(result, args.out, stem)
    print(report.markdown(result))
    log(f"done in {result['total_s']:.0f}s; wrote {', '.join(str(p) for p in paths)}")
    failed = [n for run in result["runs"] for n, s in run["systems"].items() if s.get("error")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
