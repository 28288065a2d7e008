"""No range applied twice, and none skipped, where a Delta merge's decision and its commit are far apart.

Each test forces its interleaving: a zombie instance (another DeltaTarget of the same group) merges the same
range inside the window, or a replay is cut at other offsets than the first try.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

import uploader.delta
from tests.component.uploader.test_delta_exact_rows import FAST, _files
from uploader.delta import META_WIDENED, DeltaFile, DeltaTarget, applied_files
from uploader.delta_settings import DeltaSettings


def _target(uri: str) -> DeltaTarget:
    return DeltaTarget(DeltaSettings(table_uri=uri, group_id="g", retry=FAST))


def _applications(uri: str) -> Counter[tuple[int, int]]:
    """How often each offset range was applied, from the commits' infos."""
    counted: Counter[tuple[int, int]] = Counter()
    for info in DeltaTable(uri).history():
        for f in applied_files(info):
            counted[(f["applied_from"], f["last_offset"])] += 1
    return counted


def _zombie_merges_inside(monkeypatch: pytest.MonkeyPatch, uri: str, file: DeltaFile, window: str) -> list[int]:
    """Have a zombie merge `file` right after our target's widening commit or table creation lands, before our
    target reloads the table: the window where its decision (the file is new) is stale."""
    zombie = _target(uri)
    done: list[int] = []

    def run_zombie() -> None:
        if not done:
            done.append(zombie.merge([file])[0]["version"])

    if window == "widening":
        real_write = uploader.delta.write_deltalake

        def write_then_zombie(*args, **kwargs):
            real_write(*args, **kwargs)
            properties = kwargs.get("commit_properties")
            if properties is not None and META_WIDENED in (properties.custom_metadata or {}):
                run_zombie()
        monkeypatch.setattr(uploader.delta, "write_deltalake", write_then_zombie)
    else:
        real_create = DeltaTable.create

        def create_then_zombie(*args, **kwargs):
            created = real_create(*args, **kwargs)
            run_zombie()
            return created
        monkeypatch.setattr(uploader.delta.DeltaTable, "create", create_then_zombie)
    return done


def test_a_zombie_merge_right_after_the_table_is_created_is_seen(tmp_path: Path, monkeypatch) -> None:
    uri = str(tmp_path / "table")
    file = _files(tmp_path, [[(k, {"amount": k}) for k in range(3)]], keys=())[0]  # appended: twice is visible
    zombie = _zombie_merges_inside(monkeypatch, uri, file, "creation")
    _target(uri).merge([file])
    assert zombie, "the zombie's merge ran inside the window"
    assert _applications(uri) == {(0, 2): 1}
    assert DeltaTable(uri).to_pyarrow_table().num_rows == 3


def test_a_zombie_merge_right_after_a_widening_is_seen(tmp_path: Path, monkeypatch) -> None:
    uri = str(tmp_path / "table")
    first, second = _files(tmp_path, [[(0, {"amount": 1})], [(1, {"amount": 2.5})]], keys=())
    _target(uri).merge([first])
    zombie = _zombie_merges_inside(monkeypatch, uri, second, "widening")
    _target(uri).merge([second])
    assert zombie, "the zombie's merge ran inside the window"
    assert _applications(uri) == {(0, 0): 1, (1, 1): 1}
    assert sorted(DeltaTable(uri).to_pyarrow_table()["amount"].to_pylist()) == [1.0, 2.5]


def test_a_replay_cut_at_other_offsets_applies_the_overlap_once_without_an_offset_column(tmp_path: Path) -> None:
    """SINK_METADATA_COLUMNS without `_offset` and another order field: the staged file still carries the
    offsets as bookkeeping, so the table's covered end cuts the overlap; the table never gets the column."""
    uri = str(tmp_path / "table")
    records = [(k, {"version": k, "amount": k}) for k in range(9)]
    first = _files(tmp_path / "a", [records[:6]], bookkeeping=True, keys=())
    replay = _files(tmp_path / "b", [records[3:]], bookkeeping=True, start=3, keys=())
    _target(uri).merge(first)
    _target(uri).merge(replay)
    table = DeltaTable(uri).to_pyarrow_table()
    assert sorted(table["version"].to_pylist()) == list(range(9))
    assert "_offset" not in table.column_names
    assert _applications(uri) == {(0, 5): 1, (6, 8): 1}


def test_a_file_without_offsets_that_overlaps_the_table_is_refused_not_applied_twice(tmp_path: Path) -> None:
    uri = str(tmp_path / "table")
    _target(uri).merge(_files(tmp_path / "a", [[(k, {"version": k}) for k in range(4)]], keys=()))
    by_hand = _files(tmp_path / "b", [[(k, {"version": k}) for k in range(2, 6)]], start=2, keys=())[0]
    table = pa.Table.from_pylist([{"id": k, "version": k} for k in range(2, 6)])
    import pyarrow.parquet as pq
    pq.write_table(table, by_hand.path)
    with pytest.raises(uploader.delta.DeltaRefusal, match="no _offset column"):
        _target(uri).merge([by_hand])


def test_a_widening_that_keeps_losing_to_a_busier_writer_fails_loudly(tmp_path: Path, monkeypatch) -> None:
    """A rewrite of the whole table cannot land while another writer commits more often than it takes: a few
    retries, then a fatal error that says so and what to do (it once retried every batch, forever)."""
    uri = str(tmp_path / "table")
    first = _files(tmp_path / "a", [[(0, {"amount": 1})]], keys=())[0]
    wider = _files(tmp_path / "b", [[(1, {"amount": 2.5})]], start=1, keys=())[0]
    _target(uri).merge([first])
    rival_files = [DeltaFile(f.path, dataclasses.replace(f.metadata, partition=1))  # another partition's writer
                   for f in _files(tmp_path / "c", [[(k, {"amount": k})] for k in range(10)], keys=())]
    rival = _target(uri)
    real_write = uploader.delta.write_deltalake
    lost: list[int] = []

    def rival_commits_first(*args, **kwargs):
        properties = kwargs.get("commit_properties")
        if properties is not None and META_WIDENED in (properties.custom_metadata or {}):
            lost.append(1)
            rival.merge([rival_files[len(lost) - 1]])
        return real_write(*args, **kwargs)
    monkeypatch.setattr(uploader.delta, "write_deltalake", rival_commits_first)

    with pytest.raises(uploader.delta.FatalUploadError) as failed:
        _target(uri).merge([wider])
    assert failed.value.reason == "delta_widen_contended"
    assert len(lost) == uploader.delta.WIDEN_ATTEMPTS
    for words in ("amount: int64 -> double", "Stop the table's other writers", "SINK_DELTA_TABLE_URI"):
        assert words in str(failed.value)
