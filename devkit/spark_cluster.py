"""A Spark standalone master with workers on 127.0.0.1, started from the pyspark distribution.

Executors then run in other JVMs (and other Python workers) than the driver, as on a real cluster.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import requests

from devkit.brokers import free_port
from sink_service.startup.java_home import resolve_java


def _spark_class() -> str:
    return str(Path(sys.executable).with_name("spark-class"))


@contextmanager
def standalone_cluster(workers: int = 2, cores_per_worker: int = 1, memory: str = "1g",
                       auth_secret: str | None = None) -> Iterator[str]:
    """A master URL; with `auth_secret`, master and workers require Spark's RPC authentication."""
    resolve_java()  # master, workers and executors inherit JAVA_HOME
    work = Path(tempfile.mkdtemp(prefix="spark-cluster-"))
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOG_DIR": str(work),
           "SPARK_WORKER_DIR": str(work / "work"), "PYSPARK_PYTHON": sys.executable}
    if auth_secret:
        # Through the environment, as Spark's daemons read it: on their command line `ps` would show it.
        env["SPARK_DAEMON_JAVA_OPTS"] = "-Dspark.authenticate=true"
        env["_SPARK_AUTH_SECRET"] = auth_secret
    port, ui_port = free_port(), free_port()
    master_url = f"spark://127.0.0.1:{port}"
    processes: list[subprocess.Popen] = []
    logs = []

    def launch(name: str, args: list[str]) -> None:
        log = open(work / f"{name}.log", "wb")  # noqa: SIM115 - closed below
        logs.append(log)
        processes.append(subprocess.Popen([_spark_class(), *args], env=env, stdout=log, stderr=subprocess.STDOUT))

    try:
        launch("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                          "--port", str(port), "--webui-port", str(ui_port)])
        for n in range(workers):
            launch(f"worker-{n}", ["org.apache.spark.deploy.worker.Worker", master_url, "--host", "127.0.0.1",
                                   "--cores", str(cores_per_worker), "--memory", memory,
                                   "--webui-port", str(free_port())])
        _wait_for_workers(ui_port, workers)
        yield master_url
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for log in logs:
            log.close()
        shutil.rmtree(work, ignore_errors=True)


def _wait_for_workers(ui_port: int, expected: int, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    alive = 0
    while time.monotonic() < deadline:
        try:
            state = requests.get(f"http://127.0.0.1:{ui_port}/json/", timeout=2).json()
            alive = sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")
            if alive >= expected:
                return
        except (requests.RequestException, ValueError):
            pass
        time.sleep(0.5)
    raise TimeoutError(f"only {alive} of {expected} Spark workers registered within {timeout_s}s")
