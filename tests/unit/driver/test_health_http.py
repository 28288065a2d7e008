"""The health server's POST endpoint against hostile requests, on a real socket.

Anyone who reaches the port may send anything: a bad length or a wrong token must be answered
before a byte of the body is read (a `Content-Length: -1` once made the driver read 300 MB into
memory before it looked at the token).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import pytest
import requests

from sink_service.driver.health import Health, HealthServer, SignalEndpoint
from sink_service.task.upload_signals import SIGNAL_PATH, TOKEN_HEADER

TOKEN = "t0ken"


@pytest.fixture
def server() -> Iterator[tuple[HealthServer, list[bytes]]]:
    received: list[bytes] = []

    def receive(body: bytes) -> int:
        received.append(body)
        return 200

    server = HealthServer(Health(), 0, host="127.0.0.1", signals=SignalEndpoint(SIGNAL_PATH, TOKEN, receive))
    server.start()
    try:
        yield server, received
    finally:
        server.stop()


def _post_head(port: int, headers: dict[str, str], body_prefix: bytes = b"") -> socket.socket:
    """Send a POST's request line and headers (and maybe the start of a body); keep the socket open."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    head = f"POST {SIGNAL_PATH} HTTP/1.1\r\nHost: x\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    sock.sendall(head.encode() + b"\r\n" + body_prefix)
    return sock


def _status(sock: socket.socket) -> int:
    """The response's status, read while the client still holds its side open (socket timeout 5 s)."""
    data = b""
    while b"\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return int(data.split(b" ", 2)[1])


@pytest.mark.parametrize(("length", "status"), [
    ("-1", 400),
    ("-5000000", 400),
    ("abc", 400),
    ("1e3", 400),
    (str(10**12), 413),
    (str(64 * 1024 + 1), 413),
])
def test_a_bad_length_is_answered_before_the_body_is_read(server, length, status):
    http, received = server
    # A megabyte of body follows at once and the client never ends it: a server that reads it
    # would wait for EOF, and the 5 s socket timeout would fail the test.
    sock = _post_head(http.port, {"Content-Length": length, TOKEN_HEADER: TOKEN}, b"x" * (1 << 20))
    with sock:
        assert _status(sock) == status
    assert received == []


def test_a_missing_length_is_411(server):
    http, received = server
    with _post_head(http.port, {TOKEN_HEADER: TOKEN, "Transfer-Encoding": "chunked"}, b"5\r\nhello\r\n") as sock:
        assert _status(sock) == 411
    assert received == []


@pytest.mark.parametrize("token", [None, "guess", "t0ken "])
def test_a_wrong_or_missing_token_is_403_before_the_body_is_read(server, token):
    http, received = server
    headers = {"Content-Length": "60000"} | ({TOKEN_HEADER: token} if token is not None else {})
    with _post_head(http.port, headers) as sock:  # no body at all: reading it would wait
        assert _status(sock) == 403
    assert received == []


def test_the_right_token_and_length_deliver_the_body(server):
    http, received = server
    url = f"http://127.0.0.1:{http.port}{SIGNAL_PATH}"
    assert requests.post(url, data=b'{"a": 1}', headers={TOKEN_HEADER: TOKEN}, timeout=5).status_code == 200
    assert received == [b'{"a": 1}']


def test_a_client_that_stops_sending_does_not_hold_a_thread_forever():
    http = HealthServer(Health(), 0, host="127.0.0.1", request_timeout_s=1.0,
                        signals=SignalEndpoint(SIGNAL_PATH, TOKEN, lambda body: 200))
    http.start()
    try:
        with _post_head(http.port, {"Content-Length": "100", TOKEN_HEADER: TOKEN}, b"x" * 10) as sock:
            start = time.monotonic()
            try:
                while sock.recv(4096):  # until the server gives up on the body and closes
                    pass
            except ConnectionResetError:
                pass
            assert time.monotonic() - start < 4  # the client's own timeout (5 s) never fired
    finally:
        http.stop()


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


@pytest.mark.parametrize(("token", "status"), [(None, 403), (TOKEN, 400)])
def test_a_negative_length_with_50_mb_does_not_grow_the_server(token, status):
    """The reproduced attack (no token), and the same with the token, against the health server
    alone in its own process."""
    script = textwrap.dedent(f"""
        import sys, time
        from sink_service.driver.health import Health, HealthServer, SignalEndpoint
        server = HealthServer(Health(), 0, host="127.0.0.1",
                              signals=SignalEndpoint({SIGNAL_PATH!r}, {TOKEN!r}, lambda body: 200))
        server.start()
        print(server.port, flush=True)
        time.sleep(120)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            cwd=os.getcwd())
    try:
        port = int(proc.stdout.readline())
        time.sleep(0.3)
        before = _rss_kib(proc.pid)
        sock = _post_head(port, {"Content-Length": "-1"} | ({TOKEN_HEADER: token} if token else {}))
        sent, chunk, answered = 0, b"x" * (1 << 20), None
        with sock:
            try:
                while sent < 50 << 20:
                    sock.sendall(chunk)
                    sent += len(chunk)
            except OSError:
                pass  # the server answered and closed: the rest of the body is refused
            try:
                answered = _status(sock)
            except ConnectionResetError:
                answered = "reset"  # closed on the unread body before the client read the answer
        after = _rss_kib(proc.pid)
        assert answered in (status, "reset")
        assert sent < 50 << 20, "the server took the whole 50 MB body"
        assert after - before < 10 * 1024, f"RSS grew {after - before} KiB"
        print(f"sent {sent >> 20} MiB of 50 before the server closed; its RSS grew {after - before} KiB")
    finally:
        proc.kill()
        proc.wait()


def test_a_503_between_queries_says_why():
    """A restart on a new assignment left `reason` empty: readiness answered 503 with no reason."""
    health = Health(query_running=True, broker_ok=True, reason="")
    server = HealthServer(health, 0, host="127.0.0.1")
    server.start()
    url = f"http://127.0.0.1:{server.port}/readyz"
    try:
        assert requests.get(url, timeout=5).json()["reason"] == ""
        health.update(query_running=False)
        answer = requests.get(url, timeout=5)
        assert answer.status_code == 503 and "restarting on the group's new assignment" in answer.json()["reason"]
        health.update(broker_ok=False, reason="broker unreachable: no answer within 5s")
        assert requests.get(url, timeout=5).json()["reason"] == "broker unreachable: no answer within 5s"
    finally:
        server.stop()
