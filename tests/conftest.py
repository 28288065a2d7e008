"""Shared fixtures: one broker per test session (noida-db by default; see devkit.brokers)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from devkit.brokers import running_broker


@pytest.fixture(scope="session")
def bootstrap() -> Iterator[str]:
    with running_broker() as address:
        yield address
