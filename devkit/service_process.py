"""Run `python -m sink_service` as a real child process, configured only by environment."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[1]


class ServiceProcess:
    def __init__(self, env: dict[str, str], log_path: Path):
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SINK_")}
        self.env.update(env)
        self.env["PYTHONUNBUFFERED"] = "1"
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    def start(self) -> ServiceProcess:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in wait()
        # Own session: kill -9 takes the whole group, JVM included, as a pod kill would.
        self.process = subprocess.Popen(
            [sys.executable, "-m", "sink_service"], cwd=REPO, env=self.env,
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        return self

    @property
    def pid(self) -> int:
        return self.process.pid

    def kill9(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)
        self._log.close()

    def terminate(self, timeout_s: float = 60) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.wait(timeout_s)

    def wait(self, timeout_s: float) -> int:
        try:
            code = self.process.wait(timeout_s)
        finally:
            if self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(30)
            else:
                # Reap anything left in the group (a JVM that outlived its parent).
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
            self._log.close()
        return code

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def readiness(self, port: int) -> tuple[int, dict] | None:
        try:
            response = requests.get(f"http://127.0.0.1:{port}/readyz", timeout=2)
            return response.status_code, response.json()
        except requests.RequestException:
            return None


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.5,
               process: ServiceProcess | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        if process is not None and process.process.poll() is not None:
            raise AssertionError(f"service exited ({process.process.returncode}) while waiting for {what}:\n"
                                 + process.output()[-5000:])
        time.sleep(interval_s)
    tail = process.output()[-5000:] if process else ""
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}\n{tail}")
