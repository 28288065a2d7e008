"""The search for pip-installed data sources is skipped through a Spark internal: where that changed,
the service still starts, and Spark simply searches as before."""

from __future__ import annotations

import logging

from py4j.protocol import Py4JError

from sink_service.startup import spark_session


class _ChangedSpark:
    """A session whose JVM no longer has the data source manager the skip relies on."""

    class _Jvm:
        def __getattr__(self, name: str):
            raise Py4JError(f"{name} does not exist in the JVM")

    _jvm = _Jvm()


def test_a_changed_spark_internal_only_costs_the_search(caplog):
    with caplog.at_level(logging.INFO, logger="sink_service.startup.spark_session"):
        spark_session._skip_static_source_lookup(_ChangedSpark())
    assert "searches for pip-installed data sources" in caplog.text
