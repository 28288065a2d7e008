"""EMS uploads through a real forward proxy (and a real SOCKS5 proxy) started by the test.

The proxy really forwards: it opens its own connection to the origin (a local HTTP server acting as
EMS), so "the proxy was used" is proven by the origin seeing the proxy's Via header, not only by the
request line's absolute form.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import http.server
import importlib.util
import json
import socket
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sink_service.config import load_config
from sink_service.config.upload_targets import build_target, target_settings
from uploader.ems import EmsSettings, EmsTarget
from uploader.errors import FatalUploadError
from uploader.retry import RetryPolicy
from uploader.target import FileMetadata

AUTH = "AppKey origin-app-key-0123456789"
PROXY_USER = "proxy user"
PROXY_PASSWORD = "p@ss:w0rd/!"
FAST = RetryPolicy(max_elapsed_s=2.0, initial_backoff_s=0.01, max_backoff_s=0.02)
HOP_BY_HOP = {
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te",
    "trailer", "transfer-encoding", "upgrade",
}


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: bytes


def _serve(handler: type[http.server.BaseHTTPRequestHandler]) -> tuple[http.server.ThreadingHTTPServer, str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


class Origin:
    """Acts as EMS: records each request and answers with a JSON receipt."""

    def __init__(self) -> None:
        self.seen: list[Seen] = []
        origin = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                origin.seen.append(Seen(self.path, dict(self.headers), body))
                payload = json.dumps({"id": f"upload-{len(origin.seen)}", "flushStatus": "NEW"}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                pass

        self.server, self.url = _serve(Handler)

    def endpoint(self) -> str:
        return f"{self.url}/continuous-batch-processing/api/v1/pool-1/items"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class ForwardProxy:
    """HTTP forward proxy: takes absolute-form requests, checks Proxy-Authorization, forwards them."""

    def __init__(self, username: str | None = None, password: str | None = None) -> None:
        self.forwarded = 0
        self.requests: list[str] = []  # request lines' targets (absolute-form URLs)
        self.proxy_authorizations: list[str | None] = []
        expected = None
        if username is not None:
            expected = "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                proxy.requests.append(self.path)
                proxy.proxy_authorizations.append(self.headers.get("Proxy-Authorization"))
                target = urlsplit(self.path)
                if not target.scheme:
                    return self._answer(400, {}, b"not a proxy request (origin-form)")
                if expected is not None and self.headers.get("Proxy-Authorization") != expected:
                    return self._answer(407, {"Proxy-Authenticate": 'Basic realm="test"'}, b"proxy auth required")
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                headers["Via"] = "1.1 test-proxy"
                upstream = http.client.HTTPConnection(target.hostname, target.port, timeout=10)
                try:
                    path = target.path + (f"?{target.query}" if target.query else "")
                    upstream.request(self.command, path, body=body, headers=headers)
                    response = upstream.getresponse()
                    data = response.read()
                    passed = {k: v for k, v in response.getheaders()
                              if k.lower() not in HOP_BY_HOP and k.lower() != "content-length"}
                finally:
                    upstream.close()
                proxy.forwarded += 1
                self._answer(response.status, {**passed, "Via": "1.1 test-proxy"}, data)

            def _answer(self, status: int, headers: dict[str, str], body: bytes) -> None:
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server, self.url = _serve(Handler)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(autouse=True)
def no_proxy_env(monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


@pytest.fixture
def origin():
    server = Origin()
    yield server
    server.stop()


@pytest.fixture
def proxy():
    server = ForwardProxy(PROXY_USER, PROXY_PASSWORD)
    yield server
    server.stop()


@pytest.fixture
def parquet_file(tmp_path) -> Path:
    path = tmp_path / "scratch.parquet"
    pq.write_table(pa.table({"id": [1, 2], "_offset": [5, 6]}), path)
    return path


METADATA = FileMetadata("orders", 0, 5, 6, 2, "ORDERS", ("id",), "_offset", "abc")


def ems(origin: Origin, **overrides) -> EmsTarget:
    values = dict(endpoint=origin.endpoint(), authorization=AUTH, retry=FAST, request_timeout_s=5.0)
    values.update(overrides)
    return EmsTarget(EmsSettings(**values))


def test_upload_goes_through_the_proxy_with_its_credentials(origin, proxy, parquet_file):
    with ems(origin, proxy_url=proxy.url, proxy_username=PROXY_USER, proxy_password=PROXY_PASSWORD) as target:
        receipt = target.upload(parquet_file, METADATA)
    assert receipt.response_id == "upload-1"
    assert proxy.forwarded == 1
    assert proxy.requests == [target.request_url(METADATA)]  # absolute-form: the proxy was asked
    expected = "Basic " + base64.b64encode(f"{PROXY_USER}:{PROXY_PASSWORD}".encode()).decode()
    assert proxy.proxy_authorizations == [expected]
    [seen] = origin.seen
    assert seen.headers["Via"] == "1.1 test-proxy"  # the origin got it from the proxy
    assert seen.headers["Authorization"] == AUTH  # the EMS credential passes through untouched
    assert "Proxy-Authorization" not in seen.headers  # the proxy credential stops at the proxy
    assert seen.path.startswith("/continuous-batch-processing/api/v1/pool-1/items?targetName=ORDERS")
    assert parquet_file.read_bytes() in seen.body


def test_without_a_proxy_the_upload_goes_direct(origin, proxy, parquet_file):
    with ems(origin) as target:
        target.upload(parquet_file, METADATA)
    assert proxy.forwarded == 0 and proxy.requests == []
    [seen] = origin.seen
    assert "Via" not in seen.headers


def test_wrong_proxy_password_is_fatal_and_never_reaches_the_origin(origin, proxy, parquet_file):
    target = ems(origin, proxy_url=proxy.url, proxy_username=PROXY_USER, proxy_password="wrong-password")
    with target, pytest.raises(FatalUploadError) as caught:
        target.upload(parquet_file, METADATA)
    assert caught.value.setting == "SINK_EMS_PROXY_URL"
    assert caught.value.status == 407
    assert len(proxy.requests) == 1  # not retried
    assert origin.seen == []
    assert "wrong-password" not in str(caught.value)


def test_proxy_settings_from_the_environment_reach_the_target(origin, proxy, parquet_file):
    config = load_config({
        "SINK_EMS_ENDPOINT": origin.endpoint(),
        "SINK_EMS_AUTHORIZATION": AUTH,
        "SINK_EMS_TARGET_TABLE": "{topic}",
        "SINK_EMS_PROXY_URL": proxy.url,
        "SINK_EMS_PROXY_USERNAME": PROXY_USER,
        "SINK_EMS_PROXY_PASSWORD": PROXY_PASSWORD,
        "SINK_UPLOAD_RETRY_BUDGET_MS": "2000",
    }, scope="target")
    target = build_target(target_settings(config))
    try:
        target.upload(parquet_file, METADATA)
    finally:
        target.close()
    assert proxy.forwarded == 1
    assert origin.seen[0].headers["Via"] == "1.1 test-proxy"


# --- SOCKS5 (needs PySocks) ---------------------------------------------------------------------------


class Socks5Proxy:
    """RFC 1928 CONNECT with RFC 1929 user/password authentication, relaying bytes both ways."""

    def __init__(self, username: str, password: str) -> None:
        self.username, self.password = username, password
        self.credentials: list[tuple[str, str]] = []
        self.connects: list[tuple[str, int]] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(client,), daemon=True).start()

    def _handle(self, client: socket.socket) -> None:
        with client:
            version, count = _recv(client, 2)
            methods = _recv(client, count)
            if version != 5 or 2 not in methods:
                client.sendall(b"\x05\xff")
                return
            client.sendall(b"\x05\x02")
            _, ulen = _recv(client, 2)
            user = _recv(client, ulen).decode()
            (plen,) = _recv(client, 1)
            password = _recv(client, plen).decode()
            self.credentials.append((user, password))
            if (user, password) != (self.username, self.password):
                client.sendall(b"\x01\x01")
                return
            client.sendall(b"\x01\x00")
            _, command, _, address_type = _recv(client, 4)
            if address_type == 1:
                host = socket.inet_ntoa(_recv(client, 4))
            elif address_type == 3:
                host = _recv(client, _recv(client, 1)[0]).decode()
            else:
                host = socket.inet_ntop(socket.AF_INET6, _recv(client, 16))
            (port,) = struct.unpack("!H", _recv(client, 2))
            if command != 1:
                client.sendall(b"\x05\x07\x00\x01" + bytes(6))
                return
            self.connects.append((host, port))
            with socket.create_connection((host, port), timeout=10) as upstream:
                client.sendall(b"\x05\x00\x00\x01" + bytes(6))
                pump = threading.Thread(target=_pipe, args=(upstream, client), daemon=True)
                pump.start()
                _pipe(client, upstream)
                pump.join(timeout=10)

    def stop(self) -> None:
        self._listener.close()


def _recv(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("SOCKS client went away")
        data += chunk
    return data


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while chunk := source.recv(65536):
            sink.sendall(chunk)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


@pytest.mark.skipif(importlib.util.find_spec("socks") is None, reason="PySocks is not installed")
def test_upload_through_a_socks5_proxy(origin, parquet_file):
    socks = Socks5Proxy(PROXY_USER, PROXY_PASSWORD)
    try:
        with ems(origin, proxy_url=f"socks5://127.0.0.1:{socks.port}", proxy_username=PROXY_USER,
                 proxy_password=PROXY_PASSWORD) as target:
            receipt = target.upload(parquet_file, METADATA)
    finally:
        socks.stop()
    assert receipt.response_id == "upload-1"
    assert socks.credentials == [(PROXY_USER, PROXY_PASSWORD)]
    assert socks.connects == [("127.0.0.1", int(urlsplit(origin.url).port))]
    assert len(origin.seen) == 1 and "Via" not in origin.seen[0].headers  # a tunnel, not an HTTP proxy
