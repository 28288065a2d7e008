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
