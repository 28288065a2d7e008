"""The driver's background compactions (change-log mode): they run while the service is idle, a failure that may
pass is counted and retried, one that cannot stops the service at the next batch, and shutdown ends the thread."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import sink_service.driver.delta_compactions as compactions_module
from sink_service.driver.delta_compactions import BackgroundCompactions
from sink_service.driver.metrics import SinkMetrics
from tests.component.uploader.test_delta_exact_rows import FAST, TOPIC, _files
from uploader.delta_changes import ChangeLogTarget
from uploader.delta_settings import DeltaSettings
from uploader.delta_view import current_rows
from uploader.errors import FatalUploadError, RetryableUploadError


def _wait(condition, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[DeltaSettings, BackgroundCompactions, SinkMetrics]:
    monkeypatch.setattr(compactions_module, "POLL_S", 0.1)
    settings = DeltaSettings(table_uri=str(tmp_path / "table"), group_id="g", retry=FAST, change_log=True, buckets=2,
                             compact_at_ratio=100.0, compact_max_interval_s=0.5)
    metrics = SinkMetrics()
    return settings, BackgroundCompactions(settings, tmp_path / "scratch", metrics), metrics


def _ok(metrics: SinkMetrics, result: str = "ok") -> float:
    return metrics.delta_compactions.labels(result)._value.get()


def test_changes_are_compacted_within_the_interval_while_no_batch_comes_and_stop_ends_the_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings, background, metrics = _setup(tmp_path, monkeypatch)
    files = _files(tmp_path, [[(k, {"amount": k}) for k in range(10)]])
    ChangeLogTarget(settings).merge(files)
    background.appended([f.metadata for f in files])
    background.wake()  # the batch's Kafka commit; the share is not reached (100x the table), the interval is
    _wait(lambda: _ok(metrics) >= 1)
    assert current_rows(settings, TOPIC, ("id",), "_offset").num_rows == 10
    assert background.stop(5.0)
    assert not background._thread.is_alive()


def test_a_failure_that_may_pass_is_retried_and_a_fatal_one_stops_the_next_batch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings, background, metrics = _setup(tmp_path, monkeypatch)
    files = _files(tmp_path, [[(1, {"amount": 1})]])
    ChangeLogTarget(settings).merge(files)
    failures = [RetryableUploadError("store down", reason="delta_io"), FatalUploadError("refused", reason="x")]

    def compact(*_args, **_kwargs):
        raise failures.pop(0)

    monkeypatch.setattr(background.compaction, "compact", compact)
    monkeypatch.setattr(background.compaction, "due", lambda _topic: True)
    background.appended([f.metadata for f in files])
    background.wake()
    _wait(lambda: _ok(metrics, "fatal") >= 1)
    assert _ok(metrics, "retry") == 1
    with pytest.raises(FatalUploadError, match="refused"):
        background.check()
    assert background.stop(5.0)


def test_after_a_restart_changes_no_new_batch_brings_up_are_compacted_by_the_keys_the_change_log_names(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by the chaos test: every record was committed before the last restart, so no batch appended, and the
    restarted service never learned the table or its keys (they may come from the Kafka key)."""
    settings, background, metrics = _setup(tmp_path, monkeypatch)
    ChangeLogTarget(settings).merge(_files(tmp_path, [[(k, {"amount": k}) for k in range(5)]]))
    background.known({TOPIC})  # the query's start, before any batch
    _wait(lambda: _ok(metrics) >= 1)
    assert background._tables[TOPIC] == (("id",), "_offset")
    assert background.stop(5.0)
