"""The image rehearsal's own checks (devkit/image_build.py): the user name a mode's uid gets, its modes.

The rehearsal itself needs root and minutes (scripts/image_rehearsal.sh); these parts are checked here
on real processes and files, so a check that could never fail does not pass unnoticed.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from devkit import image_build
from devkit.image_build import CheckFailed, check_passwd_entry, passwd_home

PASSWD = "root:x:0:0:root:/root:/bin/bash\nsink:x:10001:10001::/home/sink:/usr/sbin/nologin\n"


def sleeper(env: dict[str, str]) -> subprocess.Popen:
    """A process started with `env`, as the service is by the entrypoint; returned once its exec is done
    (until then /proc/<pid>/environ may read empty), as the service's is long before the rehearsal looks."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)
    deadline = time.monotonic() + 10
    while b"time.sleep" not in Path(f"/proc/{process.pid}/cmdline").read_bytes():
        assert time.monotonic() < deadline, "the sleeper did not start"
        time.sleep(0.01)
    return process


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "passwd").write_text(PASSWD)
    return tmp_path


def test_passwd_home_is_the_entry_or_none(root):
    assert passwd_home(root, "10001") == "/home/sink"
    assert passwd_home(root, "1000680000") is None


def test_a_uid_with_an_entry_needs_no_nss_wrapper():
    process = sleeper({})
    try:
        assert check_passwd_entry(process.pid, "10001", has_entry=True) == "the image's /etc/passwd"
    finally:
        process.kill()
        process.wait()
    process = sleeper({"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libnss_wrapper.so", "NSS_WRAPPER_PASSWD": "/x",
                       "NSS_WRAPPER_GROUP": "/etc/group"})
    try:
        with pytest.raises(CheckFailed, match="yet the entrypoint preloaded nss_wrapper"):
            check_passwd_entry(process.pid, "10001", has_entry=True)
    finally:
        process.kill()
        process.wait()


def test_a_uid_without_an_entry_fails_without_nss_wrapper():
    """The old image: the service started as an unknown uid with no name for the JVM."""
    process = sleeper({})
    try:
        with pytest.raises(CheckFailed, match="Invalid UID"):
            check_passwd_entry(process.pid, "1000680000", has_entry=False)
    finally:
        process.kill()
        process.wait()


def test_a_uid_without_an_entry_gets_exactly_one_line(tmp_path):
    wrapped = tmp_path / "passwd"
    wrapped.write_text(PASSWD + "sink-1000680000:x:1000680000:0:kafka-parquet-sink:/tmp:/usr/sbin/nologin\n")
    env = {"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libnss_wrapper.so", "NSS_WRAPPER_PASSWD": str(wrapped)}
    process = sleeper(env)
    try:
        found = check_passwd_entry(process.pid, "1000680000", has_entry=False)
        assert found.endswith("adds sink-1000680000:x:1000680000:0:kafka-parquet-sink:/tmp:/usr/sbin/nologin")
        wrapped.write_text(PASSWD)
        with pytest.raises(CheckFailed, match="0 lines for uid 1000680000"):
            check_passwd_entry(process.pid, "1000680000", has_entry=False)
    finally:
        process.kill()
        process.wait()


def test_modes_default_to_all_and_unknown_ones_are_refused(capsys):
    assert image_build.MODES == ("docker", "kubernetes", "any-uid", "openshift")
    with pytest.raises(SystemExit) as exit_info:
        image_build.main(["--modes", "docker,anyuid"])
    assert exit_info.value.code == 2
    assert "unknown ['anyuid']" in capsys.readouterr().err
