"""The topic every verify component test reads: produced once per session, so its offsets are known."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.component.verify.sinking import TOPIC, close_consumers, produce_topic


@pytest.fixture(scope="session")
def topic(bootstrap: str) -> Iterator[str]:
    produce_topic(bootstrap)
    yield TOPIC
    close_consumers()
