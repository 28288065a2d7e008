"""A task worker freezes its long-lived heap once, and later tasks pay nothing for it."""

from __future__ import annotations

import gc

import pytest

from sink_service.kafka_source import datasource


def test_a_worker_freezes_its_heap_after_the_first_task_only(monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(datasource, "_heap_frozen", False)
    monkeypatch.setattr(gc, "collect", lambda: calls.append("collect"))
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
    # It walks the whole permanent generation: 6-7 ms after every task in a live run's workers.
    monkeypatch.setattr(gc, "get_freeze_count", lambda: pytest.fail("counted the frozen heap"))
    for _task in range(3):
        datasource._freeze_worker_heap()
    assert calls == ["collect", "freeze"]
