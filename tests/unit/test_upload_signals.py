"""Live upload signals: a real HTTP server on the driver side, the executor's sender, the state."""

from __future__ import annotations

import json

import requests

from sink_service.health import Health, HealthServer
from sink_service.upload_signals import NO_SIGNALS, SIGNAL_PATH, LiveUploads, SignalChannel, SignalSender

TASK = ("orders", 3, 1000)


def serve(live: LiveUploads) -> tuple[HealthServer, Health]:
    health = Health(query_running=True, broker_ok=True, uploads_failing=live.failing)
    server = HealthServer(health, 0, signals=(SIGNAL_PATH, lambda body: live.receive(body)[0]))
    server.start()
    return server, health


def test_a_retry_makes_the_service_unready_at_once_and_success_makes_it_ready():
    live = LiveUploads("t0ken")
    server, health = serve(live)
    try:
        sender = SignalSender(SignalChannel(f"http://127.0.0.1:{server.port}{SIGNAL_PATH}", "t0ken"), TASK)
        sender.send("started", "f1.parquet")
        assert health.readiness()[0] and live.oldest_age_s(now=1e12) > 0
        sender.send("retry", "f1.parquet", reason="http_503", error="HTTP 503 from endpoint", started_at=5.0)
        ready, detail = health.readiness()
        assert not ready and not detail["uploads_ok"]
        assert "f1.parquet (topic=orders partition=3) after 1 attempt(s): http_503" in detail["reason"]
        assert live.oldest_age_s(now=1e12) > 1e11  # counted from the upload start the executor sent
        sender.send("finished", "f1.parquet")
        assert health.readiness()[0]
        assert live.task_ended(TASK) == {"http_503": 1}
    finally:
        server.stop()


def test_signals_with_a_wrong_token_or_garbage_change_nothing():
    live = LiveUploads("t0ken")
    server, health = serve(live)
    try:
        url = f"http://127.0.0.1:{server.port}{SIGNAL_PATH}"
        event = {"token": "guess", "kind": "retry", "task": list(TASK), "file": "f", "at": 1.0}
        assert requests.post(url, data=json.dumps(event), timeout=5).status_code == 403
        assert requests.post(url, data=b"{not json", timeout=5).status_code == 400
        assert requests.post(f"http://127.0.0.1:{server.port}/other", data=b"{}", timeout=5).status_code == 404
        assert health.readiness()[0]
    finally:
        server.stop()


def test_a_sender_without_a_channel_or_driver_never_raises():
    SignalSender(NO_SIGNALS, TASK).send("retry", "f")
    SignalSender(SignalChannel("http://127.0.0.1:9/x", "t"), TASK).send("retry", "f")  # nothing listens


def test_a_new_query_forgets_the_old_tasks():
    live = LiveUploads("t")
    live.receive(json.dumps({"token": "t", "kind": "retry", "task": list(TASK), "file": "f", "at": 1.0}).encode())
    assert live.failing() is not None
    live.clear()
    assert live.failing() is None and live.oldest_age_s(now=2.0) == 0.0
