"""Live-rate mode: each system consumes a topic while a producer writes to it at a fixed rate.

A long-running sink is judged mostly here: CPU per million records at a given rate, produce-to-upload
latency, and memory. Per rate, one producer process makes the records as it sends them; per system, a fresh topic
(the same records, so every system starts at an empty position and sees the same data), the system is
started and, once it is up (its consumer exists; the service: its streaming query started) and a few
seconds more for its group to settle, the producer writes the topic at the rate for --live-seconds. The
system runs until it has committed (Pathway: written) every record, then it is stopped.

CPU is the whole process tree's (JVM and Python workers included) from the first record produced to the
last commit, start-up excluded; librdkafka's broker threads are also counted on their own, since an idle
consumer's fetch loop spins on noida-db. Latency is per record: the file's arrival at the endpoint
(service, hand-written) or its write time on disk (Quix: file mtime; Pathway: the poll that first saw the
line) minus the record's Kafka timestamp (its produce time).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench import report
from bench.endpoint import EndpointProcess
from bench.measure import UNKNOWN_END, ProcessTreeSampler, wait_until_quiet
from bench.systems import REPO, SYSTEMS, Output, RunContext, System
from bench.workload import WorkloadSpec, produce_trailers
from devkit.brokers import reported_ends_need_trailers
from devkit.kafka_data import create_topics, end_offsets


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


class LiveProducer:
    """`python -m bench.live_producer` as a child: produces the workload's records to each topic on request."""

    def __init__(self, bootstrap: str, spec: WorkloadSpec, rate: int, seconds: float, log_path: Path):
        command = [sys.executable, "-m", "bench.live_producer", "--bootstrap", bootstrap, "--rate", str(rate),
                   "--seconds", str(seconds), "--partitions", str(spec.partitions), "--keys", str(spec.keys),
                   "--record-size", str(spec.record_size)]
        self.spec = spec
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in close()
        self.process = subprocess.Popen(command, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self._log, text=True, bufsize=1, start_new_session=True)
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, name="live-producer-stdout", daemon=True).start()
        ready = self._next(600)
        if not ready.get("ready"):
            raise RuntimeError(f"the live producer did not start: {ready}")
        self.records = int(ready["records"])

    @property
    def pid(self) -> int:
        return self.process.pid

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _next(self, timeout_s: float) -> dict:
        line = self._lines.get(timeout=timeout_s)
        if line is None:
            raise RuntimeError(f"the live producer exited (code {self.process.wait()})")
        return json.loads(line)

    def go(self, topic: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(topic + "\n")
        self.process.stdin.flush()

    def result(self, timeout_s: float = 0.0) -> dict | None:
        """The statistics of the last `go`, or None while it is still producing."""
        try:
            return self._next(timeout_s) if timeout_s else self._next(0.001)
        except queue.Empty:
            return None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if self.process.stdin:
                self.process.stdin.close()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        self._log.close()


def wait_ready(system: System, timeout_s: float) -> float:
    """Seconds until the system says it is consuming (or `timeout_s` passed)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s and system.alive():
        with contextlib.suppress(OSError):
            if system.ready():
                break
        time.sleep(0.2)
    return time.monotonic() - started


def latency(out: Output) -> dict:
    """Per record: arrival (endpoint) or write time (file) minus the Kafka timestamp, in seconds."""
    if out.produced_ms.size == 0:
        return {"records": 0}
    seconds = out.upload_s - out.produced_ms.astype(np.float64) / 1000.0
    return {"records": int(seconds.size), "p50_s": float(np.percentile(seconds, 50)),
            "p99_s": float(np.percentile(seconds, 99)), "max_s": float(seconds.max()),
            "mean_s": float(seconds.mean())}


def run_live_system(system: System, ctx: RunContext, producer: LiveProducer, endpoint: EndpointProcess,
                    group: str, args: argparse.Namespace, broker_pids: list[int], rate: int) -> dict:
    """One system at one rate: start it, wait until it is up, produce, wait until it is done, stop it.

    CPU is taken between the first record produced and the last commit, so start-up and the rest before
    the producer starts do not count; peak RSS covers the whole run.
    """
    result: dict = {"label": system.label, "group": group, "topic": ctx.topic,
                    "pushes_to_endpoint": system.pushes_to_endpoint}
    # A long run outgrows an in-memory broker (noida-db held 23 GB after 35M records): with --live-retention-s
    # the topic drops what is older, and a system that falls that far behind hits a retention gap and fails.
    retention = {"retention.ms": str(int(args.live_retention_s * 1000))} if args.live_retention_s else None
    create_topics(ctx.bootstrap, {ctx.topic: ctx.partitions}, retention)
    started = time.monotonic()
    system.start(ctx, group)
    sampler = ProcessTreeSampler(system.pid, ours={"endpoint": [endpoint.pid], "harness": [os.getpid()],
                                                      "broker": broker_pids, "producer": [producer.pid]}).__enter__()
    stats: dict | None = None
    try:
        ready_s = wait_ready(system, args.live_ready_timeout)
        time.sleep(args.live_settle)
        result["ready_s"] = round(ready_s, 2)
        watcher = system.watcher(ctx, group, dict.fromkeys(range(ctx.partitions), UNKNOWN_END))
        before = sampler.snapshot()
        go = time.monotonic()
        producer.go(ctx.topic)
        watcher.begin(go)
        while stats is None:
            watcher.poll()
            if not system.alive():
                raise RuntimeError("the system exited while the producer was running")
            stats = producer.result(0.1)
        added = (produce_trailers(ctx.bootstrap, ctx.topic, ctx.partitions, producer.spec.record_size)
                 if reported_ends_need_trailers(args.broker) else None)
        produced = stats["records"] + (added.records if added is not None else 0)
        ends = end_offsets(ctx.bootstrap, ctx.topic, ctx.partitions)
        if sum(ends.values()) < produced or (added is not None and ends != added.ends):
            raise RuntimeError(f"end offsets {ends} hold fewer than the {produced} records produced")
        # The producer is not idempotent: a send retried after a lost acknowledgement is written twice
        # (7 of 21M records in a 70-minute run). Those offsets must be committed too.
        result["producer_duplicates"] = sum(ends.values()) - produced
        watcher.set_end(ends)
        timeline = watcher.wait_until_done(go, args.timeout, system.alive, args.stall_timeout, interval_s=0.1)
        after = sampler.snapshot()
        result.update(system.before_stop())
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
        timeline = None
        if stats is None:  # let the producer finish before the next system
            stats = producer.result(600)
    finally:
        sampler.stop()
        result["exit_code"] = system.stop()
    if timeline is None:
        result["log_tail"] = system.log_path.read_text(errors="replace")[-3000:]
        log(f"{system.name} FAILED: {result['error']}\n{result['log_tail']}")
        return result
    out = system.output(ctx, endpoint)
    records = stats["records"]
    cpu = after["cpu_s"] - before["cpu_s"]
    fetch = after["fetch_thread_cpu_s"] - before["fetch_thread_cpu_s"]
    per_m = records / 1e6
    kinds = {kind: round(seconds - before["cpu_s_by_kind"].get(kind, 0.0), 2)
             for kind, seconds in after["cpu_s_by_kind"].items()}
    lat = latency(out)
    result.update({
        "records": records,
        "rate_target": rate,
        "rate_produced": stats["rate"],
        "produce_s": stats["produce_s"],
        "producer_max_behind_records": stats["max_behind_records"],
        "startup_s": round(go - started, 2),
        "last_commit_after_produce_start_s": timeline.last_commit_s,
        "drain_s": timeline.last_commit_s - stats["produce_s"] if timeline.last_commit_s is not None else None,
        "cpu_s": cpu,
        "fetch_thread_cpu_s": fetch,
        "cpu_s_per_m_records": cpu / per_m,
        "cpu_s_per_m_records_without_fetch": (cpu - fetch) / per_m,
        "fetch_cpu_s_per_m_records": fetch / per_m,
        "cpu_s_by_process_kind": kinds,
        "peak_rss_mb": sampler.peak_rss / 2**20,
        "peak_rss_mb_by_process_kind": {kind: round(rss / 2**20) for kind, rss in sampler.peak_rss_by_kind.items()},
        "peak_processes": sampler.peak_processes,
        "endpoint_cpu_s": sampler.ours_cpu_s["endpoint"],
        "harness_cpu_s": sampler.ours_cpu_s["harness"],
        "broker_cpu_s": sampler.ours_cpu_s["broker"],
        "producer_cpu_s": sampler.ours_cpu_s["producer"],
        "other_load_cores": sampler.other_cpu_s / sampler.wall_s if sampler.wall_s else None,
        "steal_cores": sampler.steal_cpu_s / sampler.wall_s if sampler.wall_s else None,
        "files": out.files,
        "mean_file_mb": out.bytes / out.files / 2**20 if out.files else None,
        "rows_in_files": out.rows,
        "endpoint_rows": endpoint.count(system.target) if system.pushes_to_endpoint else None,
        "latency": lat,
        "latency_p50_s": lat.get("p50_s"),
        "latency_p99_s": lat.get("p99_s"),
        "timeline": [[round(t, 2), n] for t, n in timeline.points],
    })
    log(f"{system.name} live: {cpu / per_m:.1f} CPU-s per million ({(cpu - fetch) / per_m:.1f} without fetch "
        f"threads), latency p50 {lat.get('p50_s', 0):.2f}s p99 {lat.get('p99_s', 0):.2f}s, peak RSS "
        f"{result['peak_rss_mb']:,.0f} MB, other load {result['other_load_cores'] or 0:.2f} cores")
    return result


def run_live(bootstrap: str, endpoint: EndpointProcess, args: argparse.Namespace, work: Path, stamp: str,
             broker_pids: list[int], context: Callable[[str, Path], RunContext]) -> list[dict]:
    """One run per rate in args.live_rates; `context(topic, workdir)` builds each system's RunContext."""
    runs = []
    for rate in args.live_rates:
        records = int(rate * args.live_seconds)
        spec = WorkloadSpec(records, args.partitions, min(args.keys, records), args.record_size)
        log(f"live: {records:,} records for {rate:,}/s x {args.live_seconds:.0f}s")
        producer = LiveProducer(bootstrap, spec, rate, args.live_seconds, work / f"live_producer_{rate}.log")
        run = {"mode": "live", "rate": rate, "seconds": args.live_seconds, "workload": spec.as_dict(),
               "records": records, "systems": {}}
        try:
            for name in args.systems:
                topic = f"live_{rate}_{name.replace('+', '_')}_{stamp}"
                workdir = work / topic
                workdir.mkdir(parents=True)
                ctx = context(topic, workdir)
                waited, busy = wait_until_quiet(args.quiet_cores, args.settle_timeout)
                log(f"live {rate:,}/s: running {name} (after {waited:.0f}s of rest; machine busy {busy:.2f} cores)")
                try:
                    run["systems"][name] = run_live_system(SYSTEMS[name](), ctx, producer, endpoint,
                                                           f"bench-{name}-{topic}", args, broker_pids, rate)
                    run["systems"][name].update(rested_s=round(waited, 1), busy_cores_before=round(busy, 2))
                except Exception as exc:  # a broken system must not lose the others' numbers
                    traceback.print_exc()
                    run["systems"][name] = {"label": SYSTEMS[name].label, "error": f"{type(exc).__name__}: {exc}"}
        finally:
            producer.close()
        run["ratios"] = report.ratios(run["systems"], report.LIVE_RATIOS)
        runs.append(run)
    return runs
