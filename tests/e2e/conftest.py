"""End-to-end fixtures: the local EMS-compatible endpoint and a factory for service processes."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from devkit.brokers import free_port
from devkit.service_process import ServiceProcess
from local_ems.server import LocalEmsServer

AUTHORIZATION = "AppKey e2e-secret-app-key-4711"
POLL_INTERVAL_S = 0.5  # the services the tests start check thresholds this often
_names = itertools.count()


@pytest.fixture(scope="session")
def ems(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalEmsServer]:
    server = LocalEmsServer(tmp_path_factory.mktemp("ems"), AUTHORIZATION)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def ems_last_upload(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalEmsServer]:
    """A second endpoint where a later upload replaces a key's row whatever its order value.

    Tests that crash or fault the service point SINK_EMS_ENDPOINT here: a partition's files that reach
    it out of offset order leave an older row behind, which the shared endpoint would hide.
    """
    server = LocalEmsServer(tmp_path_factory.mktemp("ems-last-upload"), AUTHORIZATION, upsert_mode="last-upload")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def unique() -> Callable[[str], str]:
    """Topic, group and table names unique per test, so tests can share one broker and endpoint."""
    def make(stem: str) -> str:
        return f"{stem}-{next(_names)}"
    return make


@pytest.fixture
def service_env(bootstrap: str, ems: LocalEmsServer, tmp_path: Path) -> Callable[..., dict[str, str]]:
    def make(topics: str, group: str, **overrides: str) -> dict[str, str]:
        env = {
            "SINK_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "SINK_TOPICS": topics,
            "SINK_GROUP_ID": group,
            "SINK_EMS_ENDPOINT": ems.items_url(),
            "SINK_EMS_AUTHORIZATION": AUTHORIZATION,
            "SINK_EMS_TARGET_TABLE": "{topic}",
            "SINK_PRIMARY_KEYS": "id",
            "SINK_FLUSH_INTERVAL_MS": "2000",
            "SINK_POLL_INTERVAL_MS": str(int(POLL_INTERVAL_S * 1000)),
            "SINK_HTTP_PORT": str(free_port()),
            "SINK_SCRATCH_DIR": str(tmp_path / "scratch"),
            "SINK_SHUTDOWN_TIMEOUT_MS": "20000",
        }
        env.update({k: str(v) for k, v in overrides.items()})
        return env
    return make


@pytest.fixture
def services(tmp_path: Path) -> Iterator[Callable[[dict[str, str]], ServiceProcess]]:
    """Start service processes; any still running at the end is killed (whole process group)."""
    started: list[ServiceProcess] = []

    def start(env: dict[str, str]) -> ServiceProcess:
        service = ServiceProcess(env, tmp_path / f"service-{len(started)}.log").start()
        started.append(service)
        return service

    yield start
    for service in started:
        if service.process.poll() is None:
            service.kill9()
