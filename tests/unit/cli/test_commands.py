"""The console script answers --help and --version instead of starting the service."""

from __future__ import annotations

import subprocess
import sys

from sink_service import __version__


def _sink_service(*args: str) -> subprocess.CompletedProcess[str]:
    # No SINK_* variables at all: a command that started the service would exit 2 on the configuration.
    return subprocess.run([sys.executable, "-m", "sink_service", *args], capture_output=True, text=True,
                          timeout=60, env={"PATH": "/usr/bin:/bin"})


def test_help_lists_the_subcommands_and_starts_nothing():
    done = _sink_service("--help")
    assert done.returncode == 0, done.stderr
    assert "usage: sink-service" in done.stdout
    assert "run" in done.stdout
    assert "SINK_" not in done.stderr


def test_version_answers_with_the_package_version():
    done = _sink_service("--version")
    assert (done.returncode, done.stdout.strip()) == (0, f"kafka-parquet-sink {__version__}")


def test_an_unknown_subcommand_is_a_usage_error_not_a_start():
    done = _sink_service("serve")
    assert done.returncode == 2
    assert "invalid choice: 'serve'" in done.stderr


def test_run_and_no_subcommand_both_start_the_service():
    # Both reach the configuration check: no SINK_* variables is exit 2 naming the missing settings.
    for args in ((), ("run",)):
        done = _sink_service(*args)
        assert done.returncode == 2, done.stderr
        assert "SINK_KAFKA_BOOTSTRAP_SERVERS" in done.stderr
