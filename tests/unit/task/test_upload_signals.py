"""Live upload signals: a real HTTP server on the driver side, the executor's sender, the state."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import requests

from sink_service.driver.health import Health, HealthServer, SignalEndpoint
from sink_service.driver.live_uploads import LiveUploads
from sink_service.task import upload_signals
from sink_service.task.upload_signals import (
    NO_SIGNALS,
    SIGNAL_PATH,
    TOKEN_HEADER,
    SignalChannel,
    SignalSender,
)

TASK = ("orders", 3, 1000)
TOKEN = "t0ken"


@dataclass
class Driver:
    """The driver's side of the channel: its upload state, its health, and every body it received."""

    live: LiveUploads
    health: Health
    url: str
    bodies: list[bytes] = field(default_factory=list)

    def sender(self) -> SignalSender:
        return SignalSender(SignalChannel(self.url, TOKEN), TASK)

    def kinds(self) -> list[str]:
        return [json.loads(body)["kind"] for body in self.bodies]


@pytest.fixture
def driver() -> Iterator[Driver]:
    live = LiveUploads(TOKEN)
    health = Health(query_running=True, broker_ok=True, uploads_failing=live.failing)
    bodies: list[bytes] = []

    def receive(body: bytes) -> int:
        bodies.append(body)
        return live.receive(body)[0]

    server = HealthServer(health, 0, host="127.0.0.1", signals=SignalEndpoint(SIGNAL_PATH, TOKEN, receive))
    server.start()
    try:
        yield Driver(live, health, f"http://127.0.0.1:{server.port}{SIGNAL_PATH}", bodies)
    finally:
        server.stop()


def test_a_retry_makes_the_service_unready_at_once_and_success_makes_it_ready(driver):
    sender, live, health = driver.sender(), driver.live, driver.health
    sender.started("f1.parquet")
    assert health.readiness()[0]
    sender.retried("http_503", "HTTP 503 from endpoint")
    ready, detail = health.readiness()
    assert not ready and not detail["uploads_ok"]
    assert "f1.parquet (topic=orders partition=3) after 1 attempt(s): http_503" in detail["reason"]
    assert live.oldest_age_s(now=1e12) > 1e11  # counted from the upload start the executor sent
    sender.finished("f1.parquet")
    assert health.readiness()[0] and live.oldest_age_s(now=1e12) == 0.0
    assert live.task_ended(TASK) == {"http_503": 1}


def test_a_quick_upload_costs_no_signal(driver, monkeypatch):
    monkeypatch.setattr(upload_signals, "ANNOUNCE_AFTER_S", 0.2)
    sender = driver.sender()
    for n in range(20):
        sender.started(f"f{n}.parquet")
        sender.finished(f"f{n}.parquet")
    time.sleep(0.5)  # past every announcement's time
    assert driver.bodies == []


def test_an_upload_still_running_is_announced_from_its_start_and_its_end_follows(driver, monkeypatch):
    monkeypatch.setattr(upload_signals, "ANNOUNCE_AFTER_S", 0.2)
    sender = driver.sender()
    before = time.time()
    sender.started("slow.parquet")
    deadline = time.monotonic() + 10
    while not driver.bodies and time.monotonic() < deadline:
        time.sleep(0.02)
    assert driver.kinds() == ["started"]
    # The gauge counts from the upload's start, not from the announcement.
    assert before <= json.loads(driver.bodies[0])["at"] <= before + 0.1
    assert 99.8 < driver.live.oldest_age_s(now=before + 100) <= 100
    sender.finished("slow.parquet")
    assert driver.kinds() == ["started", "finished"]
    assert driver.live.oldest_age_s(now=time.time()) == 0.0


def test_uploads_start_no_thread_each_and_every_slow_one_is_still_announced(driver, monkeypatch):
    # A timer thread per upload cost every file a thread start; one thread announces for all senders.
    monkeypatch.setattr(upload_signals, "ANNOUNCE_AFTER_S", 0.3)
    driver.sender().started("warm.parquet")  # the announcing thread exists from here on
    threads = threading.active_count()
    senders = [SignalSender(SignalChannel(driver.url, TOKEN), ("orders", n, 0)) for n in range(30)]
    for n, sender in enumerate(senders):
        sender.started(f"f{n}.parquet")
        if n % 2:
            sender.finished(f"f{n}.parquet")  # quick: never announced
    assert threading.active_count() <= threads
    deadline = time.monotonic() + 10
    while len(driver.bodies) < 16 and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.2)
    files = sorted(json.loads(body)["file"] for body in driver.bodies)
    assert files == sorted(["warm.parquet", *(f"f{n}.parquet" for n in range(0, 30, 2))])


def test_signals_with_a_wrong_token_or_garbage_change_nothing(driver):
    event = json.dumps({"kind": "retry", "task": list(TASK), "file": "f", "at": 1.0})
    assert requests.post(driver.url, data=event, headers={TOKEN_HEADER: "guess"}, timeout=5).status_code == 403
    assert requests.post(driver.url, data=event, timeout=5).status_code == 403
    good = {TOKEN_HEADER: TOKEN}
    assert requests.post(driver.url, data=b"{not json", headers=good, timeout=5).status_code == 400
    assert requests.post(driver.url, data=b"[1]", headers=good, timeout=5).status_code == 400
    other = driver.url.replace(SIGNAL_PATH, "/other")
    assert requests.post(other, data=b"{}", headers=good, timeout=5).status_code == 404
    assert driver.bodies == [b"{not json", b"[1]"]  # the refused ones never reached the receiver
    assert driver.health.readiness()[0]


def test_the_token_travels_in_a_header_never_in_the_body(driver):
    sender = driver.sender()
    sender.started("f")
    sender.retried("timeout", "x" * 100_000)  # a huge error text is cut, so the event still fits
    assert driver.kinds() == ["retry"]
    assert TOKEN.encode() not in driver.bodies[0]
    assert not driver.health.readiness()[0]


def test_a_sender_without_a_channel_or_driver_never_raises():
    for sender in (SignalSender(NO_SIGNALS, TASK),
                   SignalSender(SignalChannel("http://127.0.0.1:9/x", "t"), TASK)):  # nothing listens
        sender.started("f")
        sender.retried("timeout", "no answer")
        sender.finished("f")


def test_a_new_query_forgets_the_old_tasks():
    live = LiveUploads("t")
    live.receive(json.dumps({"kind": "retry", "task": list(TASK), "file": "f", "at": 1.0}).encode())
    assert live.failing() is not None
    live.clear()
    assert live.failing() is None and live.oldest_age_s(now=2.0) == 0.0


def test_executors_post_to_the_bound_address_or_the_drivers_when_bound_to_every_interface():
    assert upload_signals.signal_url("0.0.0.0", 8080, "127.0.0.1") == f"http://127.0.0.1:8080{SIGNAL_PATH}"
    assert upload_signals.signal_url("::", 8080, "driver-0") == f"http://driver-0:8080{SIGNAL_PATH}"
    assert upload_signals.signal_url("10.1.2.3", 8080, "127.0.0.1") == f"http://10.1.2.3:8080{SIGNAL_PATH}"
    assert upload_signals.signal_url("::1", 81, "127.0.0.1") == f"http://[::1]:81{SIGNAL_PATH}"
