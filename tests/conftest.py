"""Shared fixtures: one broker per test session (noida-db by default; see devkit.brokers)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from devkit.brokers import OwnBroker, free_port, running_broker
from devkit.moto_s3 import SerializedMotoServer


@pytest.fixture(scope="session")
def bootstrap() -> Iterator[str]:
    with running_broker() as address:
        yield address


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[OwnBroker]:
    """A noida-db broker for this test alone, which it may pause, stop and restart."""
    broker = OwnBroker(tmp_path / "broker", free_port())
    broker.data_dir.mkdir()
    broker.start()
    try:
        yield broker
    finally:
        if broker.process is not None:
            broker.signal(signal.SIGCONT)  # a paused process cannot act on SIGTERM
        broker.stop()


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    """moto's real S3 server on loopback, one per test module, its writes one at a time (devkit.moto_s3)."""
    server = SerializedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def aws_env(monkeypatch, tmp_path) -> None:
    """Dummy credentials through boto3's standard chain; nothing from the machine's ~/.aws, IMDS or proxies."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing-key-id")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing-secret-key")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ROLE_ARN",
                 "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                 "AWS_CONTAINER_CREDENTIALS_FULL_URI", "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
