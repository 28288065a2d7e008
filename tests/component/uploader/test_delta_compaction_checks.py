"""The compaction check (Compaction.sizes, after every micro-batch): what each check reads.

A check must not repeat work: the change log's add actions are read once per check.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable

from tests.component.uploader.test_delta_change_log import _settings
from tests.component.uploader.test_delta_exact_rows import TOPIC, _files
from uploader.delta_changes import ChangeLogTarget
from uploader.delta_compaction import Compaction


def _count_add_actions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The table of each get_add_actions call, as it happens."""
    real = DeltaTable.get_add_actions
    calls: list[str] = []

    def counted(self: DeltaTable, *args, **kwargs):
        calls.append(self.table_uri)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(DeltaTable, "get_add_actions", counted)
    return calls


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
