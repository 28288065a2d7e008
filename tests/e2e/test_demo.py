"""The README's first quick-start command works: the demo converges and exits 0."""

import subprocess
import sys

import pytest

from devkit.service_process import REPO

pytestmark = pytest.mark.e2e


def test_demo_runs_to_convergence(tmp_path):
    result = subprocess.run([sys.executable, "-m", "devkit.demo", "--keys", "500", "--updates", "3",
                             "--work-dir", str(tmp_path / "demo")],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "5/5 done" in result.stdout
    # A newcomer reads no client errors while the local broker starts (librdkafka logs `%3|…|FAIL|`).
    assert "Connection refused" not in result.stdout + result.stderr
    assert "|FAIL|" not in result.stdout + result.stderr
    assert "table `orders` holds 500 rows" in result.stdout
