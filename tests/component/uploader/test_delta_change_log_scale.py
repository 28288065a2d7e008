"""Change-log mode while the driver's background compaction runs beside a reader (found by bench/delta_table_sizes).

A reader's view is two snapshots, the keyed table's and the change log's. A compaction commits to the keyed table,
then deletes the applied rows from the change log. A view that opens the keyed table first and the change log
after a compaction happened in between has neither copy of the compacted changes: each changed key shows its older
row from the keyed table, as if the updates were undone, until the reader looks again.
"""

from __future__ import annotations

from pathlib import Path

from deltalake import DeltaTable

from tests.component.uploader.test_delta_change_log import _rows, _settings
from tests.component.uploader.test_delta_exact_rows import TOPIC, _expected, _files
from uploader import delta_view
from uploader.delta_changes import ChangeLogTarget
from uploader.delta_compaction import Compaction


def test_a_compaction_between_the_views_two_snapshots_never_undoes_an_update(tmp_path: Path, monkeypatch) -> None:
    settings = _settings(tmp_path)
    target, compaction = ChangeLogTarget(settings), Compaction(settings, tmp_path / "scratch")
    phases = [[(1, {"amount": 1}), (2, {"amount": 2})], [(1, {"amount": 10})]]
    files = _files(tmp_path, phases)
    target.merge(files[:1])
    compaction.compact(TOPIC, ("id",), "_offset")
    target.merge(files[1:])  # the change log holds key 1's update; the keyed table its first row
    opened = delta_view._open
    opens: list[str] = []

    def open_then_compact(uri: str, options: dict | None) -> DeltaTable | None:
        """The background compaction commits right after the view's first snapshot is taken."""
        table = opened(uri, options)
        opens.append(uri)
        if len(opens) == 1:
            compaction.compact(TOPIC, ("id",), "_offset")
        return table

    monkeypatch.setattr(delta_view, "_open", open_then_compact)
    view = _rows(delta_view.current_rows(settings, TOPIC, ("id",), "_offset"))
    assert len(opens) == 2, "both snapshots were taken"
    assert view == _expected(phases), "key 1 must show amount 10: its update is in one snapshot or the other"


def test_a_reader_that_takes_the_keyed_tables_snapshot_first_still_sees_every_update(tmp_path: Path,
                                                                                      monkeypatch) -> None:
    """SQL engines resolve the two tables in no set order: applied rows stay in the change log for a while
    (KEEP_APPLIED_S), so a keyed snapshot from before a compaction and a change-log snapshot from after it still
    hold every update between them."""
    settings = _settings(tmp_path)
    target, compaction = ChangeLogTarget(settings), Compaction(settings, tmp_path / "scratch")
    phases = [[(1, {"amount": 1}), (2, {"amount": 2})], [(1, {"amount": 10})]]
    files = _files(tmp_path, phases)
    target.merge(files[:1])
    compaction.compact(TOPIC, ("id",), "_offset")
    target.merge(files[1:])
    before = DeltaTable(settings.uri_for(TOPIC))  # the reader's keyed snapshot, then the compaction
    compaction.compact(TOPIC, ("id",), "_offset")
    opened = delta_view._open
    monkeypatch.setattr(delta_view, "_open", lambda uri, options: before if uri == settings.uri_for(TOPIC)
                        else opened(uri, options))
    assert _rows(delta_view.current_rows(settings, TOPIC, ("id",), "_offset")) == _expected(phases)
    assert DeltaTable(settings.changes_uri_for(TOPIC)).to_pyarrow_table().num_rows > 0, "applied rows kept a while"


def test_changes_a_compaction_applied_and_keeps_for_readers_do_not_make_the_next_one_due(tmp_path: Path) -> None:
    """Applied rows stay in the change log KEEP_APPLIED_S for readers; counted as pending, they keep the change log
    above its share of the table right after every compaction, and the driver's thread compacts again at once:
    bench/delta_table_sizes at 10M keys rewrote the 200 MB keyed table every ~30 s instead of every ~80 s."""
    settings = _settings(tmp_path, compact_at_ratio=0.5)
    target, compaction = ChangeLogTarget(settings), Compaction(settings, tmp_path / "scratch")  # the default keep
    target.merge(_files(tmp_path / "a", [[(k, {"amount": k}) for k in range(2000)]]))
    compaction.compact(TOPIC, ("id",), "_offset")
    assert DeltaTable(settings.changes_uri_for(TOPIC)).to_pyarrow_table().num_rows > 0, "applied rows kept a while"
    assert not compaction.due(TOPIC), "nothing is pending: every change-log row is applied"
