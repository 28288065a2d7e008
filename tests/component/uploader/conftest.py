"""The local EMS endpoint for the parking tests, one per module, with that module's `AUTH` key."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from local_ems.server import LocalEmsServer


@pytest.fixture(scope="module")
def ems(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalEmsServer]:
    server = LocalEmsServer(tmp_path_factory.mktemp("ems"), request.module.AUTH)
    server.start()
    yield server
    server.stop()
