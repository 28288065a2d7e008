"""The systems under test: how each is started, stopped, and where its output files are.

Each system runs as a child process in its own session (so the whole tree, a JVM included, can be measured
and stopped by its process-group id) and consumes the benchmark topic with its own consumer group.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import requests

from bench.measure import LineWatcher, OffsetWatcher, ProgressWatcher
from devkit.brokers import free_port
from devkit.service_process import ServiceProcess

BENCH = Path(__file__).resolve().parents[1]
REPO = BENCH.parent
QUIX_VENV = BENCH / ".venv-quix"
PATHWAY_VENV = BENCH / ".venv-pathway"
DEFAULT_TRANSFORM_SQL = "SELECT *, amount * 2 AS amount2 FROM records"


@dataclass
class RunContext:
    bootstrap: str
    topic: str
    partitions: int
    items_url: str
    authorization: str
    work: Path  # scratch directory of this workload
    flush_records: int
    flush_interval_ms: int
    max_files_per_batch: int | None = None
    service_env: dict[str, str] = field(default_factory=dict)
    pathway_autocommit_ms: int = 1500  # Pathway's autocommit_duration_ms (its default in a backlog run)
    pathway_metadata: bool = False  # Pathway's `_metadata` column (Kafka timestamps): live mode only
    transform_sql: str = DEFAULT_TRANSFORM_SQL  # SINK_TRANSFORM_SQL of the service+sql variant


@dataclass
class Output:
    """What a system wrote: per file its size, rows and arrival time; per record its Kafka timestamp."""

    files: int = 0
    bytes: int = 0
    rows: int = 0
    upload_s: np.ndarray = field(default_factory=lambda: np.empty(0))  # per record: arrival time of its file
    produced_ms: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))  # per record: Kafka timestamp


def _timestamps_ms(path: str | Path) -> np.ndarray:
    column = pq.read_table(path, columns=["_timestamp"]).column("_timestamp")
    if pa.types.is_timestamp(column.type):
        values = column.cast(pa.int64()).to_numpy()
        scale = {"s": 1000, "ms": 1, "us": 1e-3, "ns": 1e-6}[column.type.unit]
        return values if scale == 1 else (values * scale).astype(np.int64)
    return column.to_numpy().astype(np.int64)


def collect(entries: list[tuple[float, int, str]]) -> Output:
    """entries: (arrival time, bytes, parquet path) per file."""
    out = Output(files=len(entries), bytes=sum(size for _, size, _ in entries))
    arrivals, stamps = [], []
    for arrived, _, path in entries:
        ts = _timestamps_ms(path)
        stamps.append(ts)
        arrivals.append(np.full(ts.size, arrived))
    if stamps:
        out.produced_ms = np.concatenate(stamps)
        out.upload_s = np.concatenate(arrivals)
    out.rows = int(out.produced_ms.size)
    return out


class ChildProcess:
    """A command in its own session, output to a log file; stopped by SIGTERM, then its group by SIGKILL."""

    def __init__(self, command: list[str], log_path: Path, env: dict[str, str] | None = None, cwd: Path = REPO):
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in terminate()
        self.process = subprocess.Popen(command, cwd=cwd, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                        start_new_session=True)

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def terminate(self, timeout_s: float = 60) -> int | None:
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            code = None
        with contextlib.suppress(ProcessLookupError):  # the process and anything left in its group
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)
        self._log.close()
        return code


class System:
    name = ""
    label = ""
    pushes_to_endpoint = True

    def start(self, ctx: RunContext, group: str) -> None:
        raise NotImplementedError

    def watcher(self, ctx: RunContext, group: str, end_offsets: dict[int, int]) -> ProgressWatcher:
        """How the benchmark sees progress: the group's committed offsets, unless a system says otherwise."""
        return OffsetWatcher(ctx.bootstrap, group, ctx.topic, end_offsets)

    @property
    def pid(self) -> int:
        raise NotImplementedError

    def alive(self) -> bool:
        raise NotImplementedError

    def ready(self) -> bool:
        """Live mode: whether the system is up and consuming, so the producer may start.

        By default: one of its processes has a librdkafka broker thread, i.e. its consumer exists (the
        benchmark then waits a little more for the group to assign it its partitions).
        """
        return _has_rdkafka_broker_thread(self.pid)

    def before_stop(self) -> dict:
        """Anything to read from the running system after its last commit (e.g. its metrics)."""
        return {}

    def stop(self) -> int | None:
        raise NotImplementedError

    def output(self, ctx: RunContext, endpoint) -> Output:
        raise NotImplementedError


def _endpoint_output(endpoint, target: str) -> Output:
    return collect([(u["received_at"], u["bytes"], u["path"]) for u in endpoint.uploads(target)])


class SinkService(System):
    """(a) this service: `python -m sink_service`, pushing to the local EMS endpoint."""

    name, label = "service", "sink service (Spark)"

    def extra_env(self, ctx: RunContext) -> dict[str, str]:
        """Settings a variant of the service adds on top of the benchmark's."""
        return {}

    def start(self, ctx: RunContext, group: str) -> None:
        self.http_port = free_port()
        self.target = f"{self.name.replace('+', '_')}_{ctx.topic}"
        env = {
            "SINK_KAFKA_BOOTSTRAP_SERVERS": ctx.bootstrap,
            "SINK_TOPICS": ctx.topic,
            "SINK_GROUP_ID": group,
            "SINK_STARTING_OFFSETS": "earliest",
            "SINK_TARGET": "ems",
            "SINK_EMS_ENDPOINT": ctx.items_url,
            "SINK_EMS_AUTHORIZATION": ctx.authorization,
            "SINK_EMS_TARGET_TABLE": self.target,
            "SINK_EMS_CLIENT_ID": "bench-service",
            "SINK_PRIMARY_KEYS": "id",
            "SINK_FLUSH_RECORDS": str(ctx.flush_records),
            "SINK_FLUSH_INTERVAL_MS": str(ctx.flush_interval_ms),
            "SINK_HTTP_PORT": str(self.http_port),
            "SINK_SCRATCH_DIR": str(ctx.work / "service_scratch"),
        }
        if ctx.max_files_per_batch is not None:
            env["SINK_MAX_FILES_PER_BATCH"] = str(ctx.max_files_per_batch)
        env.update(ctx.service_env)
        env.update(self.extra_env(ctx))
        self.log_path = ctx.work / f"{self.name.replace('+', '_')}.log"
        self.process = ServiceProcess(env, self.log_path).start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.process.poll() is None

    def before_stop(self) -> dict:
        try:
            text = requests.get(f"http://127.0.0.1:{self.http_port}/metrics", timeout=5).text
        except requests.RequestException:
            return {}
        return service_metrics(text)

    def stop(self) -> int | None:
        try:
            return self.process.terminate(90)
        except subprocess.TimeoutExpired:
            return None

    def output(self, ctx: RunContext, endpoint) -> Output:
        return _endpoint_output(endpoint, self.target)

    def phases(self, started_wall: float) -> dict:
        return service_phases(self.log_path.read_text(errors="replace"), started_wall)

    def ready(self) -> bool:
        """The streaming query has started (JVM, Spark session and source are up): live mode may produce."""
        text = self.log_path.read_text(errors="replace")
        return any(m.group(4).startswith("streaming query") and m.group(4).endswith("started")
                   for m in map(_LOG_LINE.match, text.splitlines()) if m)


class SinkServiceSql(SinkService):
    """(a') the service with a SQL transform (`SINK_TRANSFORM_SQL`, from --transform-sql): the transform's cost.

    Opt-in only (`--systems service,service+sql`): the setting is being added on another branch.
    """

    name, label = "service+sql", "sink service + SQL transform"

    def extra_env(self, ctx: RunContext) -> dict[str, str]:
        return {"SINK_TRANSFORM_SQL": ctx.transform_sql}


_LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) \w+ (\S+): (.*)$")
_BATCH = re.compile(r"batch (\d+): (\d+) range\(s\), (\d+) record\(s\) uploaded, .* in ([0-9.]+)s$")


def service_phases(text: str, started_wall: float) -> dict:
    """Where the service's wall time went, from its own log (seconds since the process was started)."""
    phases: dict = {}
    batches = []
    for line in text.splitlines():
        match = _LOG_LINE.match(line)
        if not match:
            continue
        at = time.mktime(time.strptime(match.group(1), "%Y-%m-%d %H:%M:%S")) + int(match.group(2)) / 1000
        at -= started_wall
        message = match.group(4)
        if message.startswith("starting kafka-parquet-sink"):
            phases.setdefault("python_started_s", round(at, 2))
        elif message.startswith("starting query at"):
            phases.setdefault("spark_up_s", round(at, 2))
        elif message.startswith("streaming query") and message.endswith("started"):
            phases.setdefault("query_started_s", round(at, 2))
        elif batch := _BATCH.search(message):
            duration = float(batch.group(4))
            batches.append((at - duration, at, int(batch.group(2)), int(batch.group(3))))
    if batches:
        phases["first_batch_started_s"] = round(batches[0][0], 2)
        phases["first_batch_s"] = round(batches[0][1] - batches[0][0], 2)
        phases["batches"] = len(batches)
        phases["batch_s_total"] = round(sum(end - start for start, end, _, _ in batches), 2)
        phases["batch_list"] = [{"start_s": round(a, 2), "seconds": round(b - a, 2), "ranges": r, "records": n}
                                for a, b, r, n in batches]
    return phases


def service_metrics(text: str) -> dict:
    """The few Prometheus series that say where the service spent its time."""
    wanted = {
        "sink_microbatch_duration_seconds_sum": "batch_seconds_total",
        "sink_microbatch_duration_seconds_count": "batches",
        "sink_upload_duration_seconds_sum": "upload_seconds_total",
        "sink_upload_duration_seconds_count": "uploads",
    }
    found: dict[str, float] = {}
    for line in text.splitlines():
        match = re.match(r"^([a-z_]+)(\{[^}]*\})?\s+([0-9.eE+-]+)$", line)
        if match and match.group(1) in wanted:
            key = wanted[match.group(1)]
            found[key] = found.get(key, 0.0) + float(match.group(3))
    return found


class _ChildProcessSystem(System):
    """A peer that runs as one plain child process (`self.process`, set by `start`)."""

    process: ChildProcess

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.alive()

    def stop(self) -> int | None:
        return self.process.terminate(60)


class QuixFileSink(_ChildProcessSystem):
    """(b) Quix Streams FileSink (Parquet, local files), in its own virtualenv."""

    name, label = "quix", "Quix FileSink (Parquet)"
    pushes_to_endpoint = False

    def start(self, ctx: RunContext, group: str) -> None:
        self.out = ctx.work / "quix_out"
        command = [str(QUIX_VENV / "bin" / "python"), str(BENCH / "systems" / "quix_filesink.py"),
                   "--bootstrap", ctx.bootstrap, "--topic", ctx.topic, "--group", group, "--out", str(self.out),
                   "--commit-interval", str(ctx.flush_interval_ms / 1000),
                   "--commit-every", str(ctx.flush_records * ctx.partitions)]
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
        env["PYTHONUNBUFFERED"] = "1"
        self.log_path = ctx.work / "quix.log"
        self.process = ChildProcess(command, self.log_path, env)

    def output(self, ctx: RunContext, endpoint) -> Output:
        files = sorted((self.out / "files").rglob("*.parquet"))
        return collect([(f.stat().st_mtime, f.stat().st_size, str(f)) for f in files])


class Handwritten(_ChildProcessSystem):
    """(c) confluent-kafka -> pyarrow.json -> Parquet -> POST -> commit, one Python process."""

    name, label = "handwritten", "hand-written (confluent-kafka + pyarrow)"

    def start(self, ctx: RunContext, group: str) -> None:
        self.target = f"handwritten_{ctx.topic}"
        command = [sys.executable, str(BENCH / "systems" / "handwritten.py"), "--bootstrap", ctx.bootstrap,
                   "--topic", ctx.topic, "--group", group, "--endpoint", ctx.items_url, "--target", self.target,
                   "--flush-records", str(ctx.flush_records), "--flush-interval-ms", str(ctx.flush_interval_ms)]
        env = dict(os.environ, EMS_AUTHORIZATION=ctx.authorization, PYTHONUNBUFFERED="1")
        self.log_path = ctx.work / "handwritten.log"
        self.process = ChildProcess(command, self.log_path, env)

    def output(self, ctx: RunContext, endpoint) -> Output:
        return _endpoint_output(endpoint, self.target)


class PathwayJsonLines(_ChildProcessSystem):
    """(d) Pathway: `pw.io.kafka.read` (JSON, schema of the workload) into `pw.io.jsonlines.write`, own venv.

    Its Kafka reader leaves librdkafka's auto-commit on: the group's offsets follow what was read, not what
    was written, so progress is the number of lines in its output file (`LineWatcher`).
    """

    name, label = "pathway", "Pathway (JSON Lines file)"
    pushes_to_endpoint = False

    def start(self, ctx: RunContext, group: str) -> None:
        self.out = ctx.work / "pathway_out" / "records.jsonl"
        self.out.parent.mkdir(parents=True, exist_ok=True)
        command = [str(PATHWAY_VENV / "bin" / "python"), str(BENCH / "systems" / "pathway_jsonlines.py"),
                   "--bootstrap", ctx.bootstrap, "--topic", ctx.topic, "--group", group, "--out", str(self.out),
                   "--autocommit-ms", str(ctx.pathway_autocommit_ms)]
        self.timestamps_known = ctx.pathway_metadata
        if ctx.pathway_metadata:
            command.append("--with-metadata")
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
        env.update(PYTHONUNBUFFERED="1", PATHWAY_MONITORING_LEVEL="none")
        self.log_path = ctx.work / "pathway.log"
        self.process = ChildProcess(command, self.log_path, env)

    def watcher(self, ctx: RunContext, group: str, end_offsets: dict[int, int]) -> ProgressWatcher:
        self.lines = LineWatcher(self.out, end_offsets)
        return self.lines

    def output(self, ctx: RunContext, endpoint) -> Output:
        self.lines.count()
        arrivals = self.lines.line_times()
        # Without `_metadata` (backlog run) every record was produced before the start: latency is measured
        # from the start anyway (bench.measure.latency_stats), so a timestamp of 0 stands in.
        produced = _pathway_timestamps_ms(self.out) if self.timestamps_known else np.zeros(arrivals.size, np.int64)
        n = min(arrivals.size, produced.size)
        size = self.out.stat().st_size if self.out.exists() else 0
        return Output(files=1 if size else 0, bytes=size, rows=int(produced.size), upload_s=arrivals[:n],
                      produced_ms=produced[:n])


def _pathway_timestamps_ms(path: Path) -> np.ndarray:
    """The Kafka timestamp of every line Pathway wrote (its `_metadata` column), in file order."""
    import pyarrow.json as pj

    if not path.exists() or path.stat().st_size == 0:
        return np.empty(0, np.int64)
    metadata = pa.struct([("timestamp_millis", pa.int64())])
    options = pj.ParseOptions(explicit_schema=pa.schema([("_metadata", metadata)]),
                              unexpected_field_behavior="ignore")
    table = pj.read_json(path, parse_options=options, read_options=pj.ReadOptions(block_size=64 << 20))
    return table.column("_metadata").combine_chunks().field("timestamp_millis").to_numpy(zero_copy_only=False)


def _has_rdkafka_broker_thread(pid: int) -> bool:
    try:
        processes = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return False
    for p in processes:
        for tid in _thread_ids(p.pid):
            with contextlib.suppress(OSError):
                if Path(f"/proc/{p.pid}/task/{tid}/comm").read_text().startswith("rdk:broker"):
                    return True
    return False


def _thread_ids(pid: int) -> list[str]:
    try:
        return os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []


from bench.systems.delta_table import SinkServiceDelta  # noqa: E402 - it subclasses SinkService, defined above

SYSTEMS: dict[str, type[System]] = {"service": SinkService, "pathway": PathwayJsonLines, "quix": QuixFileSink,
                                    "handwritten": Handwritten, "service+sql": SinkServiceSql,
                                    "delta": SinkServiceDelta}
DEFAULT_SYSTEMS = ("service", "pathway", "quix", "handwritten")  # service+sql and delta are opt-in
