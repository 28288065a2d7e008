"""Live upload signals: a real HTTP server on the driver side, the executor's sender, the state."""

from __future__ import annotations

import json
import time

import requests

from sink_service import upload_signals
from sink_service.health import Health, HealthServer
from sink_service.upload_signals import NO_SIGNALS, SIGNAL_PATH, LiveUploads, SignalChannel, SignalSender

TASK = ("orders", 3, 1000)


def serve(live: LiveUploads, received: list[dict] | None = None) -> tuple[HealthServer, Health]:
    def receive(body: bytes) -> int:
        if received is not None:
            received.append(json.loads(body))
        return live.receive(body)[0]

    health = Health(query_running=True, broker_ok=True, uploads_failing=live.failing)
    server = HealthServer(health, 0, signals=(SIGNAL_PATH, receive))
    server.start()
    return server, health


def sender_to(server: HealthServer, token: str) -> SignalSender:
    return SignalSender(SignalChannel(f"http://127.0.0.1:{server.port}{SIGNAL_PATH}", token), TASK)


def test_a_retry_makes_the_service_unready_at_once_and_success_makes_it_ready():
    live = LiveUploads("t0ken")
    server, health = serve(live)
    try:
        sender = sender_to(server, "t0ken")
        sender.started("f1.parquet")
        assert health.readiness()[0]
        sender.retried("f1.parquet", 5.0, "http_503", "HTTP 503 from endpoint")
        ready, detail = health.readiness()
        assert not ready and not detail["uploads_ok"]
        assert "f1.parquet (topic=orders partition=3) after 1 attempt(s): http_503" in detail["reason"]
        assert live.oldest_age_s(now=1e12) > 1e11  # counted from the upload start the executor sent
        sender.finished("f1.parquet")
        assert health.readiness()[0] and live.oldest_age_s(now=1e12) == 0.0
        assert live.task_ended(TASK) == {"http_503": 1}
    finally:
        server.stop()


def test_a_quick_upload_costs_no_signal(monkeypatch):
    monkeypatch.setattr(upload_signals, "ANNOUNCE_AFTER_S", 0.2)
    live, received = LiveUploads("t"), []
    server, _ = serve(live, received)
    try:
        sender = sender_to(server, "t")
        for n in range(20):
            sender.started(f"f{n}.parquet")
            sender.finished(f"f{n}.parquet")
        time.sleep(0.5)  # past every announcement's time
        assert received == []
    finally:
        server.stop()


def test_an_upload_still_running_is_announced_from_its_start_and_its_end_follows(monkeypatch):
    monkeypatch.setattr(upload_signals, "ANNOUNCE_AFTER_S", 0.2)
    live, received = LiveUploads("t"), []
    server, _ = serve(live, received)
    try:
        sender = sender_to(server, "t")
        before = time.time()
        sender.started("slow.parquet")
        deadline = time.monotonic() + 10
        while not received and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [e["kind"] for e in received] == ["started"]
        # The gauge counts from the upload's start, not from the announcement.
        assert before <= received[0]["at"] <= before + 0.1
        assert 99.8 < live.oldest_age_s(now=before + 100) <= 100
        sender.finished("slow.parquet")
        assert [e["kind"] for e in received] == ["started", "finished"]
        assert live.oldest_age_s(now=time.time()) == 0.0
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
    for sender in (SignalSender(NO_SIGNALS, TASK),
                   SignalSender(SignalChannel("http://127.0.0.1:9/x", "t"), TASK)):  # nothing listens
        sender.started("f")
        sender.retried("f", 1.0, "timeout", "no answer")
        sender.finished("f")


def test_a_new_query_forgets_the_old_tasks():
    live = LiveUploads("t")
    live.receive(json.dumps({"token": "t", "kind": "retry", "task": list(TASK), "file": "f", "at": 1.0}).encode())
    assert live.failing() is not None
    live.clear()
    assert live.failing() is None and live.oldest_age_s(now=2.0) == 0.0
