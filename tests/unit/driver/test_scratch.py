"""Scratch areas: one per live service, leftovers of dead ones reused and cleared."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sink_service.driver import scratch
from sink_service.driver.scratch import ScratchBusy, ScratchUnsafe, claim_scratch
from tests.support.config_helpers import ems_env


def test_two_services_on_one_directory_get_separate_areas(tmp_path):
    first = claim_scratch(tmp_path)
    (first.path / "checkpoints").mkdir()
    second = claim_scratch(tmp_path)
    assert first.path != second.path
    assert (first.path / "checkpoints").is_dir(), "the second start must not clear a live neighbour's area"
    first.release()
    second.release()


def test_a_dead_services_area_is_reused_and_cleared(tmp_path):
    # A process that claims an area and is killed with SIGKILL: the kernel drops its lock.
    code = textwrap.dedent(f"""
        import os, signal
        from pathlib import Path
        from sink_service.driver.scratch import claim_scratch
        area = claim_scratch(Path({str(tmp_path)!r}))
        (area.path / "checkpoints").mkdir()
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    subprocess.run([sys.executable, "-c", code], check=False)
    area = claim_scratch(tmp_path)
    assert area.path == tmp_path / "instance-0"
    assert [p.name for p in area.path.iterdir()] == [scratch.LOCK_FILE]
    area.release()


def test_no_free_area_names_the_setting(tmp_path, monkeypatch):
    monkeypatch.setattr(scratch, "MAX_INSTANCES", 1)
    held = claim_scratch(tmp_path)
    with pytest.raises(ScratchBusy, match="SINK_SCRATCH_DIR"):
        claim_scratch(tmp_path)
    held.release()


# --- Another local user must not be able to steer the scratch area -----------------------------

def _scratch_env(scratch_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SINK_")}
    return env | ems_env(SINK_SCRATCH_DIR=str(scratch_dir), SINK_KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:9",
                         SINK_HTTP_PORT="0")


def test_a_symlinked_instance_directory_is_refused_and_its_target_survives(tmp_path):
    base, victim = tmp_path / "scratch", tmp_path / "victim"
    base.mkdir(mode=0o700)
    victim.mkdir()
    (victim / "precious.txt").write_text("not yours")
    (base / "instance-0").symlink_to(victim)
    with pytest.raises(ScratchUnsafe, match=r"SINK_SCRATCH_DIR.*instance-0.*symlink"):
        claim_scratch(base)
    assert (victim / "precious.txt").read_text() == "not yours"
    assert sorted(p.name for p in victim.iterdir()) == ["precious.txt"]  # not even a lock file


def test_a_symlinked_base_is_refused_and_its_target_survives(tmp_path):
    victim = tmp_path / "victim"
    (victim / "instance-0").mkdir(parents=True)
    (victim / "instance-0" / "precious.txt").write_text("not yours")
    (tmp_path / "scratch").symlink_to(victim)
    with pytest.raises(ScratchUnsafe, match=r"SINK_SCRATCH_DIR.*symlink"):
        claim_scratch(tmp_path / "scratch")
    assert (victim / "instance-0" / "precious.txt").read_text() == "not yours"


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
@pytest.mark.parametrize("owned_by_other", ["base", "instance-0"])
def test_a_directory_owned_by_another_user_is_refused(tmp_path, owned_by_other):
    base = tmp_path / "scratch"
    (base / "instance-0").mkdir(parents=True)
    (base / "instance-0" / "planted").write_text("x")
    other = base if owned_by_other == "base" else base / "instance-0"
    os.chown(other, 12345, 12345)
    with pytest.raises(ScratchUnsafe, match=r"SINK_SCRATCH_DIR.*owned by uid 12345"):
        claim_scratch(base)
    assert (base / "instance-0" / "planted").exists()


def test_created_directories_are_private(tmp_path):
    old_umask = os.umask(0o022)
    try:
        area = claim_scratch(tmp_path / "new" / "scratch")
    finally:
        os.umask(old_umask)
    try:
        assert stat.S_IMODE((tmp_path / "new" / "scratch").stat().st_mode) == 0o700
        assert stat.S_IMODE(area.path.stat().st_mode) == 0o700
        assert stat.S_IMODE((area.path / scratch.LOCK_FILE).stat().st_mode) == 0o600
    finally:
        area.release()


def test_an_existing_instance_directory_of_ours_is_made_private(tmp_path):
    (tmp_path / "instance-0").mkdir(mode=0o755)
    os.chmod(tmp_path / "instance-0", 0o755)
    area = claim_scratch(tmp_path)
    assert stat.S_IMODE(area.path.stat().st_mode) == 0o700
    area.release()


def test_the_service_refuses_a_symlinked_scratch_area_with_exit_2(tmp_path):
    base, victim = tmp_path / "scratch", tmp_path / "victim"
    base.mkdir(mode=0o700)
    victim.mkdir()
    (victim / "precious.txt").write_text("not yours")
    (base / "instance-0").symlink_to(victim)
    try:
        done = subprocess.run([sys.executable, "-m", "sink_service"], env=_scratch_env(base),
                              capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the service started on a symlinked scratch area instead of refusing it")
    assert done.returncode == 2, done.stderr[-2000:]
    assert "SINK_SCRATCH_DIR" in done.stderr and "instance-0" in done.stderr
    assert (victim / "precious.txt").read_text() == "not yours"


def test_an_unusable_path_is_a_scratch_error_naming_the_setting(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(scratch.ScratchError, match="SINK_SCRATCH_DIR"):
        claim_scratch(tmp_path / "file" / "scratch")
    with pytest.raises(ScratchUnsafe, match=r"SINK_SCRATCH_DIR.*not a directory"):
        claim_scratch(tmp_path / "file")
