"""The local EMS endpoint in a process of its own, as the benchmarks use it.

A real endpoint's work is not on the systems' host at all. In the benchmark's own process the endpoint
also shared one interpreter lock with the sampler and the offset watchers; apart, its CPU is measured on
its own and it never waits for the harness. (That alone changed nothing measurable: 1M records over 96
partitions, service alone, 24.3k records/s against 24.7-25.8k in three runs before. What made its uploads
wait was SQLite's fsync, see `local_ems/store.py`.)
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from local_ems.client import LocalEmsClient


class EndpointProcess(LocalEmsClient):
    """`python -m local_ems` on a free port; the client's inspection methods reach it over HTTP."""

    def __init__(self, process: subprocess.Popen, items_url: str) -> None:
        super().__init__(items_url)
        self.process = process

    @property
    def pid(self) -> int:
        return self.process.pid


@contextlib.contextmanager
def endpoint_process(data_dir: Path, authorization: str) -> Iterator[EndpointProcess]:
    process = subprocess.Popen(
        [sys.executable, "-m", "local_ems", "--port", "0", "--data-dir", str(data_dir),
         "--authorization", authorization, "--log-level", "WARNING"],
        stdout=subprocess.PIPE, text=True)
    try:
        items_url = process.stdout.readline().strip()
        if not items_url:
            raise RuntimeError(f"the local EMS endpoint exited with code {process.wait(30)} before it listened")
        endpoint = EndpointProcess(process, items_url)
        endpoint.wait_healthy()
        yield endpoint
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
