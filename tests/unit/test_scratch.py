"""Scratch areas: one per live service, leftovers of dead ones reused and cleared."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from sink_service import scratch
from sink_service.scratch import ScratchBusy, claim_scratch


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
        from sink_service.scratch import claim_scratch
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
