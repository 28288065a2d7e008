"""Metrics are correct, not just present: a known workload, then /metrics against what happened."""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import Producer

from devkit.kafka_data import create_topics
from devkit.service_process import wait_until
from tests.e2e.checks import all_committed, metric_total, scrape_metrics

pytestmark = pytest.mark.e2e


def test_metrics_match_a_known_workload(bootstrap, ems, unique, service_env, services):
    topic, group = unique("metrics"), unique("group")
    create_topics(bootstrap, {topic: 2})
    producer = Producer({"bootstrap.servers": bootstrap})
    for n in range(3000):
        producer.produce(topic, key=f"k{n}".encode(), value=json.dumps({"id": f"id-{n}", "n": n}).encode(),
                         partition=n % 2)
    producer.produce(topic, key=b"bad-json", value=b"{oops", partition=0)
    producer.produce(topic, key=b"tombstone", value=None, partition=1)
    producer.flush(10)

    ems.inject_fault(503, count=2)
    started = time.time()
    env = service_env(topic, group, SINK_FLUSH_RECORDS=400, SINK_ERROR_POLICY="skip", SINK_FLUSH_INTERVAL_MS=1000,
                      SINK_LOG_FORMAT="json")
    port = int(env["SINK_HTTP_PORT"])
    service = services(env)
    wait_until(lambda: all_committed(bootstrap, group, topic, 2), 180, "all commits", process=service)
    wait_until(lambda: metric_total(scrape_metrics(port), "sink_consumer_lag_records", topic=topic) == 0
               and len(_total_by_partition(scrape_metrics(port), "sink_consumer_lag_records", topic)) == 2,
               30, "lag to be reported as 0", process=service)
    samples = scrape_metrics(port)
    uploads = ems.uploads(topic)
    assert service.terminate() == 0

    assert metric_total(samples, "sink_records_read_total", topic=topic) == 3002
    assert metric_total(samples, "sink_records_written_total", topic=topic) == 3000
    assert metric_total(samples, "sink_records_uploaded_total", topic=topic) == 3000
    assert metric_total(samples, "sink_files_uploaded_total", topic=topic) == len(uploads)
    assert metric_total(samples, "sink_uploaded_bytes_total", topic=topic) == sum(u["bytes"] for u in uploads)
    assert metric_total(samples, "sink_upload_duration_seconds_count") == len(uploads)
    assert metric_total(samples, "sink_upload_retries_total", reason="http_503") == 2
    assert metric_total(samples, "sink_upload_failures_total") == 0
    assert metric_total(samples, "sink_bad_records_total", topic=topic, reason="invalid_json") == 1
    assert metric_total(samples, "sink_bad_records_total", topic=topic, reason="tombstone") == 1
    assert metric_total(samples, "sink_pending_records", topic=topic) == 0
    assert metric_total(samples, "sink_microbatch_duration_seconds_count") >= 1
    commits = _total_by_partition(samples, "sink_last_commit_timestamp_seconds", topic)
    assert len(commits) == 2 and all(started < t <= time.time() for t in commits.values())
    committed = _total_by_partition(samples, "sink_committed_offset", topic)
    assert committed == {"0": 1501, "1": 1501}

    # The JSON log has one event per upload with stable field names, matching the endpoint's log.
    events = [json.loads(line) for line in service.output().splitlines() if line.startswith("{")]
    upload_events = [e for e in events if e.get("event") == "upload"]
    assert {e["response_id"] for e in upload_events} == {u["id"] for u in uploads}
    for event in upload_events:
        assert {"ts", "level", "topic", "partition", "first_offset", "last_offset", "rows", "bytes", "duration_s",
                "attempts", "target", "response_id"} <= set(event)
    assert any(e.get("event") == "config" for e in events)


def _total_by_partition(samples: dict, name: str, topic: str) -> dict[str, float]:
    return {dict(ls)["partition"]: v for (n, ls), v in samples.items() if n == name and dict(ls).get("topic") == topic}
