"""What the benchmark observes from outside a system: its process tree, its committed offsets, its files."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil
from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient


class ProcessTreeSampler:
    """Samples RSS summed over a process and all its descendants (JVM and Python workers included).

    Also accumulates the CPU time of the tree and of the whole machine, so a run can say how much CPU
    other processes (a CI run on the same machine, say) took while it ran.
    """

    def __init__(self, pid: int, interval_s: float = 0.2, ours: Mapping[str, Iterable[int]] | None = None):
        self.root = psutil.Process(pid)
        self.interval_s = interval_s
        # The benchmark's own processes (itself, its endpoint, the broker, a producer), by name: not
        # "other load", each group's CPU reported on its own.
        self.ours = {name: [psutil.Process(p) for p in pids] for name, pids in (ours or {}).items()}
        self.peak_rss = 0
        self.peak_rss_by_kind: dict[str, int] = {}  # what made up the peak
        self.peak_processes = 0
        self.samples: list[tuple[float, int]] = []  # (monotonic, rss bytes)
        self._cpu: dict[int, float] = {}  # pid -> last seen user+system seconds of a tree member
        # (pid, tid) -> last seen CPU seconds of a librdkafka broker thread ("rdk:broker*"): on noida-db an idle
        # consumer's fetch threads spin, so CPU is reported with and without them.
        self._fetch_cpu: dict[tuple[int, int], float] = {}
        self._kind: dict[int, str] = {}  # pid -> what the process is (see _process_kind)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def __enter__(self) -> ProcessTreeSampler:
        self._t0 = time.monotonic()
        self._machine0 = _busy_cpu_seconds()
        self._steal0 = _steal_cpu_seconds()
        self._ours0 = {name: sum(map(cpu_seconds, group)) for name, group in self.ours.items()}
        self._thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self.stop()

    def stop(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(5)
        self.wall_s = time.monotonic() - self._t0
        machine = _busy_cpu_seconds() - self._machine0
        self.steal_cpu_s = _steal_cpu_seconds() - self._steal0
        self.ours_cpu_s = {name: sum(map(cpu_seconds, group)) - self._ours0[name] for name, group in self.ours.items()}
        self.other_cpu_s = max(0.0, machine - sum(self.ours_cpu_s.values()) - self.tree_cpu_s)

    @property
    def tree_cpu_s(self) -> float:
        return sum(self._cpu.values())

    @property
    def fetch_thread_cpu_s(self) -> float:
        """CPU seconds of librdkafka's broker (fetch) threads in the tree."""
        return sum(self._fetch_cpu.values())

    def snapshot(self) -> dict:
        """Take a sample now and return the tree's CPU so far: subtract two snapshots for a window's CPU."""
        self.sample()
        return {"cpu_s": self.tree_cpu_s, "fetch_thread_cpu_s": self.fetch_thread_cpu_s,
                "cpu_s_by_kind": self.cpu_s_by_kind}

    @property
    def cpu_s_by_kind(self) -> dict[str, float]:
        """CPU seconds of the tree by kind of process: where a multi-process system spends it."""
        totals: dict[str, float] = {}
        for pid, seconds in self._cpu.items():
            kind = self._kind.get(pid, "other")
            totals[kind] = totals.get(kind, 0.0) + seconds
        return {kind: round(seconds, 2) for kind, seconds in totals.items()}

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def sample(self) -> None:
        try:
            processes = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return
        rss_by_kind: dict[str, int] = {}
        for p in processes:
            with contextlib.suppress(psutil.Error), p.oneshot():
                if self._kind.get(p.ppid()) == "jvm" and _process_kind(p) == "jvm":
                    # The JVM forking a process (a Python worker): until the child execs, it is a copy whose
                    # pages are the JVM's, and counting them doubled the JVM in 2 of 6 live runs (610 MB).
                    continue
                rss = p.memory_info().rss
                self._cpu[p.pid] = cpu_seconds(p)
                # Until known: spark-submit's shell script becomes the JVM by exec, under the same pid.
                if self._kind.get(p.pid, "other") == "other":
                    self._kind[p.pid] = "main" if p.pid == self.root.pid else _process_kind(p)
                kind = self._kind[p.pid]
                rss_by_kind[kind] = rss_by_kind.get(kind, 0) + rss
            if self._kind.get(p.pid) != "jvm":  # no librdkafka in the JVM; it has the most threads
                for tid, seconds in _fetch_thread_cpu(p.pid).items():
                    self._fetch_cpu[(p.pid, tid)] = seconds
        rss = sum(rss_by_kind.values())
        self.samples.append((time.monotonic(), rss))
        if rss > self.peak_rss:
            self.peak_rss, self.peak_rss_by_kind = rss, rss_by_kind
        self.peak_processes = max(self.peak_processes, len(processes))


def _process_kind(p: psutil.Process) -> str:
    try:
        command = p.cmdline()
    except psutil.Error:
        return "other"
    program = Path(command[0]).name if command else ""
    if program == "java":
        return "jvm"
    if program.startswith("python") and any("pyspark" in part for part in command[1:]):
        return "python workers"
    return "other"


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _fetch_thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds per librdkafka broker thread of a process (Linux: thread names from /proc/PID/task/TID/stat).

    librdkafka names its threads `rdk:main`, `rdk:broker<id>` (one per broker connection: the fetch and
    produce I/O) and so on; only the broker threads are counted.
    """
    found: dict[int, float] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        left, right = data.find(b"("), data.rfind(b")")
        if not data[left + 1:right].startswith(b"rdk:broker"):
            continue
        fields = data[right + 2:].split()  # fields[0] is field 3 (state): utime is field 14, stime field 15
        found[int(tid)] = (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
    return found


def cpu_seconds(p: psutil.Process) -> float:
    """User + system CPU of one process; 0 once it is gone."""
    try:
        t = p.cpu_times()
        return t.user + t.system
    except psutil.Error:
        return 0.0


def _busy_cpu_seconds() -> float:
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0) - _steal(t)


def wait_until_quiet(max_busy_cores: float, timeout_s: float, window_s: float = 2.0) -> tuple[float, float]:
    """Wait until the machine's busy CPU (steal excluded) stays below `max_busy_cores` for one window.

    A broker keeps working after a large produce (noida-db: a full core for about 12 s after 2M
    records), so a fixed pause would hand that work to whichever system runs first.
    Returns (seconds waited, busy cores in the last window); gives up after `timeout_s`.
    """
    started = time.monotonic()
    while True:
        before = _busy_cpu_seconds()
        time.sleep(window_s)
        busy = (_busy_cpu_seconds() - before) / window_s
        waited = time.monotonic() - started
        if busy < max_busy_cores or waited >= timeout_s:
            return waited, busy


def _steal_cpu_seconds() -> float:
    """CPU time the hypervisor gave to other virtual machines: this machine's noise floor."""
    return _steal(psutil.cpu_times())


def _steal(t) -> float:
    return getattr(t, "steal", 0.0)


@dataclass
class CommitTimeline:
    """Committed offsets of one group (or lines written), polled until they reach the end offsets."""

    started: float  # monotonic time the system's process was started
    points: list[tuple[float, int]] = field(default_factory=list)  # (seconds since start, committed records)
    first_commit_s: float | None = None
    first_commit_records: int = 0
    last_commit_s: float | None = None


UNKNOWN_END = 2**62  # live mode: the end offsets are known only once the producer has finished


class ProgressWatcher:
    """Polls how far a system got, into a CommitTimeline; subclasses say how (offsets committed, lines written).

    Live mode polls while the producer runs (`begin`, then `poll`), sets the end offsets once it has finished
    (`set_end`) and then waits (`wait_until_done`); a backlog run only waits.
    """

    def __init__(self, end_offsets: dict[int, int]):
        self.end = dict(end_offsets)
        self.timeline: CommitTimeline | None = None
        self._last, self._progressed = -1, 0.0

    @property
    def total(self) -> int:
        return sum(self.end.values())

    def set_end(self, end_offsets: dict[int, int]) -> None:
        self.end = dict(end_offsets)

    def progress(self) -> tuple[int, bool]:
        """(records done, whether everything is done); may raise while the broker is busy."""
        raise NotImplementedError

    def begin(self, started: float) -> None:
        self.timeline = CommitTimeline(started)
        self._last, self._progressed = -1, started

    def poll(self) -> bool:
        """One poll into the timeline; True once everything is done."""
        assert self.timeline is not None
        now = time.monotonic()
        try:
            done, complete = self.progress()
        except Exception:  # broker busy: try again next round
            return False
        timeline, elapsed = self.timeline, now - self.timeline.started
        if done != self._last:
            timeline.points.append((elapsed, done))
            self._last, self._progressed = done, now
        if done > 0 and timeline.first_commit_s is None:
            timeline.first_commit_s, timeline.first_commit_records = elapsed, done
        if complete:
            timeline.last_commit_s = elapsed
        return complete

    def wait_until_done(self, started: float, timeout_s: float, alive, stall_s: float,
                        interval_s: float = 0.2) -> CommitTimeline:
        """Poll until every partition is done (committed to its end offset, or all its lines written).

        Gives up when `alive()` turns False, after `timeout_s`, or when nothing new was done for `stall_s`.
        """
        if self.timeline is None:
            self.begin(started)
        assert self.timeline is not None
        deadline = self.timeline.started + timeout_s
        self._progressed = max(self._progressed, time.monotonic())
        while True:
            if self.poll():
                return self.timeline
            now = time.monotonic()
            if not alive():
                raise RuntimeError(f"the system exited before finishing ({self._last}/{self.total})")
            if now > deadline:
                raise TimeoutError(f"not everything done after {timeout_s:.0f}s ({self._last}/{self.total})")
            if now - self._progressed > stall_s:
                raise TimeoutError(f"no progress for {stall_s:.0f}s ({self._last}/{self.total} so far)")
            time.sleep(interval_s)


class OffsetWatcher(ProgressWatcher):
    """Progress = the consumer group's committed offsets (`AdminClient.list_consumer_group_offsets`)."""

    def __init__(self, bootstrap: str, group: str, topic: str, end_offsets: dict[int, int]):
        super().__init__(end_offsets)
        self.admin = AdminClient({"bootstrap.servers": bootstrap})
        self.group, self.topic = group, topic

    def committed(self) -> dict[int, int]:
        request = ConsumerGroupTopicPartitions(self.group, [TopicPartition(self.topic, p) for p in self.end])
        futures = self.admin.list_consumer_group_offsets([request], request_timeout=10)
        result = next(iter(futures.values())).result()
        return {tp.partition: max(tp.offset, 0) for tp in result.topic_partitions}

    def progress(self) -> tuple[int, bool]:
        committed = self.committed()
        done = sum(min(committed.get(p, 0), end) for p, end in self.end.items())
        return done, all(committed.get(p, 0) >= end for p, end in self.end.items())


class LineWatcher(ProgressWatcher):
    """Progress = lines in an output file (a system whose group offsets do not follow its output: Pathway).

    Also keeps (wall time, lines) at every change, so each line's write time is known to within one poll.
    """

    def __init__(self, path: Path, end_offsets: dict[int, int]):
        super().__init__(end_offsets)
        self.path = path
        self.lines = 0
        self._position = 0
        self.arrivals: list[tuple[float, int]] = []  # (time.time(), lines written by then)

    def progress(self) -> tuple[int, bool]:
        self.count()
        return min(self.lines, self.total), self.lines >= self.total

    def count(self) -> int:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._position)
                data = f.read()
        except FileNotFoundError:
            return self.lines
        if data:
            # Count complete lines only: a partial last line is counted at the next poll.
            complete = data.rfind(b"\n") + 1
            self._position += complete
            new = data.count(b"\n", 0, complete)
            if new:
                self.lines += new
                self.arrivals.append((time.time(), self.lines))
        return self.lines

    def line_times(self) -> np.ndarray:
        """Per line (file order): the wall time of the first poll that saw it."""
        if not self.arrivals:
            return np.empty(0)
        times = np.array([t for t, _ in self.arrivals])
        counts = np.array([n for _, n in self.arrivals])
        return times[np.searchsorted(counts, np.arange(self.lines), side="right")]


def latency_stats(upload_s: np.ndarray, produced_ms: np.ndarray, started_wall_s: float) -> dict:
    """Per-record latency from produce (Kafka timestamp) to upload, in seconds.

    `raw` is upload time minus Kafka timestamp. Every system runs on a backlog that was produced before it
    started (and after the systems before it), so raw latency mostly measures the wait for earlier systems;
    `backlog` measures from max(produce time, system start) instead and is the one to compare.
    """
    if produced_ms.size == 0:
        return {"records": 0}
    produced_s = produced_ms.astype(np.float64) / 1000.0
    raw = upload_s - produced_s
    rebased = upload_s - np.maximum(produced_s, started_wall_s)
    return {
        "records": int(produced_ms.size),
        "p50_s": float(np.percentile(rebased, 50)),
        "p99_s": float(np.percentile(rebased, 99)),
        "max_s": float(rebased.max()),
        "raw_p50_s": float(np.percentile(raw, 50)),
        "raw_p99_s": float(np.percentile(raw, 99)),
    }


def machine_info() -> dict:
    info = {"cores": os.cpu_count(), "memory_gb": round(psutil.virtual_memory().total / 2**30, 1)}
    with contextlib.suppress(OSError):
        for line in open("/proc/cpuinfo"):  # noqa: SIM115 - read once
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    return info
