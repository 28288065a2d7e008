"""The compaction check (Compaction.sizes, after every micro-batch) and its log reader: what each check reads, and
that the S3 client it reads the log with is closed with the compaction.

A check must not repeat work: the change log's add actions are read once per check, and a log entry delta-rs's log
clean-up removed is asked for once, not at every check (on S3 one 404 per check, forever).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable

from tests.component.uploader.test_delta_change_log import _settings
from tests.component.uploader.test_delta_exact_rows import TOPIC, _files
from uploader.delta_changes import ChangeLogTarget, add_actions
from uploader.delta_compaction import Compaction
from uploader.delta_log import CommitLog
from uploader.delta_settings import DeltaSettings
from uploader.delta_storage import storage_options


def _count_add_actions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The table of each get_add_actions call, as it happens."""
    real = DeltaTable.get_add_actions
    calls: list[str] = []

    def counted(self: DeltaTable, *args, **kwargs):
        calls.append(self.table_uri)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(DeltaTable, "get_add_actions", counted)
    return calls


def _count_log_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of each log entry CommitLog reads, found or not."""
    real = CommitLog._read
    reads: list[str] = []

    def counted(self: CommitLog, name: str) -> str | None:
        reads.append(name)
        return real(self, name)

    monkeypatch.setattr(CommitLog, "_read", counted)
    return reads


def test_a_check_reads_the_change_logs_add_actions_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both the buckets holding rows (Stamps.floors) and the pending bytes come from one reading of the add actions."""
    settings = _settings(tmp_path)
    target, compaction = ChangeLogTarget(settings), Compaction(settings, tmp_path / "scratch", keep_applied_s=3600)
    target.merge(_files(tmp_path / "a", [[(k, {"amount": k}) for k in range(40)]]))
    compaction.compact(TOPIC, ("id",), "_offset")
    target.merge(_files(tmp_path / "b", [[(k, {"amount": 100 + k}) for k in range(0, 40, 3)]], start=40))
    before = compaction.sizes(TOPIC)
    calls = _count_add_actions(monkeypatch)
    sizes = compaction.sizes(TOPIC)
    assert sizes == before and sizes is not None and sizes.changes > 0
    changes_uri = DeltaTable(settings.changes_uri_for(TOPIC)).table_uri
    assert calls.count(changes_uri) == 1, calls


def _log_cleaned_up_below_a_checkpoint(tmp_path: Path) -> tuple[Path, int]:
    """A change log compacted once, appended to until checkpointed, then its entries below the checkpoint removed (as
    delta-rs's log clean-up does): the removed entry right above the applied version, and the log directory."""
    settings = _settings(tmp_path)
    target = ChangeLogTarget(settings)
    target.merge(_files(tmp_path / "first", [[(k, {"amount": k}) for k in range(20)]]))
    Compaction(settings, tmp_path / "scratch", keep_applied_s=3600).compact(TOPIC, ("id",), "_offset")
    applied = DeltaTable(settings.uri_for(TOPIC)).transaction_version(settings.compaction_app_id(0))
    assert applied is not None
    for n in range(1, 13):
        target.merge(_files(tmp_path / f"f{n}", [[(k, {"amount": n}) for k in range(20)]], start=20 * n))
    entries = Path(settings.changes_uri_for(TOPIC)) / "_delta_log"
    checkpoints = sorted(int(p.name.split(".")[0]) for p in entries.glob("*.checkpoint.parquet"))
    assert checkpoints and checkpoints[-1] > applied + 1, "a checkpoint above the applied version"
    for entry in entries.glob("*.json"):
        if int(entry.name.split(".")[0]) < checkpoints[-1]:
            entry.unlink()
    return entries, applied + 1


def test_a_log_entry_the_clean_up_removed_is_read_once_and_its_rows_stay_pending(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A version below the log's oldest entry never comes back: remembered as missing, not asked for again at every
    check. The rows whose stamp it held stay pending (the bucket's floor is unknown), check after check."""
    _, gone = _log_cleaned_up_below_a_checkpoint(tmp_path)
    settings = _settings(tmp_path)
    compaction = Compaction(settings, tmp_path / "scratch", keep_applied_s=3600)
    reads = _count_log_reads(monkeypatch)
    first = compaction.sizes(TOPIC)
    second = compaction.sizes(TOPIC)
    name = f"_delta_log/{gone:020d}.json"
    assert reads.count(name) == 1, f"{name} read {reads.count(name)} times over two checks"
    changes = DeltaTable(settings.changes_uri_for(TOPIC))
    every_byte = sum(add_actions(changes).column("size_bytes").to_pylist())
    assert first == second and first is not None and first.changes == every_byte, "every row treated as pending"


def _on_moto(tmp_path: Path, moto_url: str) -> DeltaSettings:
    """A change log on moto's S3 server, compacted once, then appended to: a check reads its log through boto3."""
    import uuid

    import boto3

    bucket = f"checks-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1").create_bucket(Bucket=bucket)
    settings = _settings(tmp_path, table_uri=f"s3://{bucket}/lake/{{topic}}", endpoint_url=moto_url,
                         region="us-east-1")
    target = ChangeLogTarget(settings)
    target.merge(_files(tmp_path / "a", [[(k, {"amount": k}) for k in range(8)]]))
    Compaction(settings, tmp_path / "scratch", keep_applied_s=3600).compact(TOPIC, ("id",), "_offset")
    target.merge(_files(tmp_path / "b", [[(1, {"amount": 10})]], start=8))
    return settings


def _spy_on_clients(compaction: Compaction, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each S3 client of the compaction's log readers, named when its close() is called (then really closed)."""
    closed: list[str] = []
    for uri, stamps in compaction._stamps.items():
        client = stamps.log._s3._client
        real_close = client.close

        def close(uri: str = uri, real_close=real_close) -> None:
            closed.append(uri)
            real_close()

        monkeypatch.setattr(client, "close", close)
    return closed


def test_closing_the_compaction_closes_the_s3_client_it_reads_the_log_with(
        moto_url, aws_env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _on_moto(tmp_path, moto_url)
    compaction = Compaction(settings, tmp_path / "scratch", keep_applied_s=3600)
    sizes = compaction.sizes(TOPIC)
    assert sizes is not None and sizes.changes > 0, "the check read the log's stamps through boto3"
    closed = _spy_on_clients(compaction, monkeypatch)
    assert len(closed) == 0 and len(compaction._stamps) == 1
    compaction.close()
    assert closed == [DeltaTable(settings.changes_uri_for(TOPIC), storage_options=storage_options(settings)).table_uri]
    assert compaction.sizes(TOPIC) == sizes, "a check after close() reads the log with a client of its own"
    compaction.close()


def test_the_drivers_compactions_close_their_s3_client_when_stopped(
        moto_url, aws_env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The owner that lives for the service's run closes the compaction once its thread has ended (not while a
    compaction may still be reading)."""
    import time

    from sink_service.driver.delta_compactions import BackgroundCompactions
    from sink_service.driver.metrics import SinkMetrics

    settings = _on_moto(tmp_path, moto_url)
    background = BackgroundCompactions(settings, tmp_path / "scratch", SinkMetrics())
    background.known({TOPIC})  # the query's start: the thread looks at the change log (reads its keys and stamps)
    deadline = time.monotonic() + 30
    while not background.compaction._stamps:
        assert time.monotonic() < deadline, "the compaction thread never read the change log's log"
        time.sleep(0.05)
    closed = _spy_on_clients(background.compaction, monkeypatch)
    assert background.stop(30.0)
    assert len(closed) == 1
