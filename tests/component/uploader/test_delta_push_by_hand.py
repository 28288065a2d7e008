"""The documented recovery for a Delta table: `python -m uploader push <parked file>` applies it.

By the time an operator pushes a parked file, the service has merged later files of its partition, so the
table's progress is past the parked range: a push that followed the service's rule (skip what the table
covers) did nothing and exited 0. By hand, every row is applied under the order-column rule, and the push
records no progress.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

from deltalake import DeltaTable

from tests.component.uploader.test_delta_exact_rows import FAST, _files
from uploader import cli
from uploader.delta import DeltaRefusal, DeltaTarget
from uploader.delta_settings import DeltaSettings
from uploader.directory import DirectorySettings
from uploader.parking import ParkingTarget


def test_a_parked_file_pushed_by_hand_applies_its_newer_rows_and_says_what_it_applied(tmp_path: Path) -> None:
    uri = str(tmp_path / "orders")
    target = DeltaTarget(DeltaSettings(table_uri=uri, group_id="grp", retry=FAST))
    before, parked, after = _files(tmp_path, [
        [(1, {"status": "A"}), (2, {"status": "A"})],  # offsets 0-1
        [(1, {"status": "B"}), (3, {"status": "B"})],  # offsets 2-3: refused, parked
        [(1, {"status": "C"})],  # offset 4
    ])
    target.merge([before])
    parking = ParkingTarget(target, DirectorySettings(path=str(tmp_path / "parked")))
    stored = parking.park(parked.path, parked.metadata, DeltaRefusal([parked.metadata], uri, "made up for the test"))
    target.merge([after])
    progress = DeltaTable(uri).transaction_version("kafka-parquet-sink/grp/orders/0")
    assert progress == 5

    out, err = io.StringIO(), io.StringIO()
    env = {"SINK_TARGET": "delta", "SINK_DELTA_TABLE_URI": uri, "SINK_GROUP_ID": "grp", "SINK_PRIMARY_KEYS": "id",
           "SINK_UPLOAD_RETRY_BUDGET_MS": "5000"}
    code = cli.main(["push", stored.location], environ=env, stdout=out, stderr=err)

    assert code == 0, err.getvalue()
    receipt = json.loads(out.getvalue())
    assert receipt["details"]["num_target_rows_inserted"] == 1  # key 3
    assert receipt["details"]["rows_not_applied"] == 1  # key 1 at offset 2: the table's offset 4 is newer
    rows = {r["id"]: r["status"] for r in DeltaTable(uri).to_pyarrow_table().to_pylist()}
    assert rows == {1: "C", 2: "A", 3: "B"}
    assert DeltaTable(uri).transaction_version("kafka-parquet-sink/grp/orders/0") == progress
