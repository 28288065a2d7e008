"""When a Python worker hands freed heap pages back: only after it grew, so small reads pay nothing."""

from __future__ import annotations

import pytest

from sink_service.task import heap_release
from sink_service.task.heap_release import GROWTH_BYTES, release_if_grown


@pytest.fixture
def worker(monkeypatch: pytest.MonkeyPatch) -> dict:
    state = {"resident": 200 << 20, "trims": 0}

    def trim(_pad: int) -> int:
        state["trims"] += 1
        state["resident"] -= 100 << 20  # what the trim handed back
        return 1

    monkeypatch.setattr(heap_release, "_malloc_trim", trim)
    monkeypatch.setattr(heap_release, "resident_bytes", lambda: state["resident"])
    monkeypatch.setattr(heap_release, "_trimmed_at", 0)
    return state


def test_trims_once_grown_then_not_again_until_it_grows_by_the_step(worker: dict) -> None:
    assert release_if_grown() and worker["trims"] == 1  # 200 MB since start
    assert not release_if_grown()  # nothing grew since
    worker["resident"] += GROWTH_BYTES - 1
    assert not release_if_grown()
    worker["resident"] += 1
    assert release_if_grown() and worker["trims"] == 2


def test_without_malloc_trim_nothing_happens(worker: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heap_release, "_malloc_trim", None)
    worker["resident"] += 10 * GROWTH_BYTES
    assert not release_if_grown()
    assert worker["trims"] == 0


def test_the_real_allocator_is_found_on_linux() -> None:
    assert heap_release._malloc_trim is not None
    assert heap_release.resident_bytes() > 0
