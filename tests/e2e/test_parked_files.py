"""SINK_REJECTED_FILE_POLICY=park: a file the endpoint rejects (400) is parked, the rest flows on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from devkit.kafka_data import Workload, create_topics, produce_orders
from devkit.service_process import wait_until
from tests.e2e.checks import all_committed, metric_total, scrape_metrics, table_matches

pytestmark = pytest.mark.e2e


def test_a_rejected_file_is_parked_and_the_service_continues(bootstrap, ems, unique, service_env, services,
                                                               tmp_path: Path):
    topic, group = unique("parked"), unique("group")
    parked = tmp_path / "parked"
    create_topics(bootstrap, {topic: 2})
    env = service_env(topic, group, SINK_REJECTED_FILE_POLICY="park", SINK_PARKED_PATH=str(parked),
                      SINK_FLUSH_RECORDS=50)
    port = int(env["SINK_HTTP_PORT"])
    service = services(env)
    wait_until(lambda: (service.readiness(port) or (0,))[0] == 200, 120, "the service to be ready", process=service)

    ems.inject_fault(400, count=1)
    workload = Workload()
    produce_orders(bootstrap, topic, keys=200, updates=1, workload=workload)
    wait_until(lambda: all_committed(bootstrap, group, topic, 2), 120, "commits to the end", process=service)

    files = sorted(parked.rglob("*.parquet"))
    assert len(files) == 1, service.output()[-3000:]
    response = json.loads(files[0].with_name(files[0].name + ".response.json").read_text())
    assert response["status"] == 400
    assert response["metadata"]["topic"] == topic
    assert response["metadata"]["primary_keys"] == ["id"]
    rows = {row["id"] for row in ems.table(topic)}
    parked_rows = response["metadata"]["record_count"]
    assert len(rows) == 200 - parked_rows, "everything but the parked file is delivered"
    samples = scrape_metrics(port)
    assert metric_total(samples, "sink_parked_files_total", topic=topic, reason="http_400") == 1
    assert "file rejected and parked" in service.output()
    assert service.process.poll() is None
    assert service.terminate() == 0

    # Re-pushing the parked file by hand (metadata from its sidecar) completes the table.
    pushed = subprocess.run([sys.executable, "-m", "uploader", "push", str(files[0])],
                            env={**os.environ, **env}, capture_output=True, text=True, timeout=120)
    assert pushed.returncode == 0, pushed.stderr
    assert table_matches(ems, topic, workload)
