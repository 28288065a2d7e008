"""`sink-service run` (and `sink-service` alone): start the service."""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import signal
import sys
from typing import TYPE_CHECKING

# Only light imports before `main` holds the stop signals: the rest are imported in it.
from sink_service import __version__
from sink_service.startup.stop_signals import hold_stop_signals

if TYPE_CHECKING:
    from sink_service.config import SinkConfig

log = logging.getLogger("sink_service")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`run` takes no arguments: the service is configured only by SINK_* environment variables."""


def _secrets(config: SinkConfig) -> list[str]:
    from sink_service.config import declared_fields, is_secret_kafka_option

    values = [getattr(config, f.name) for f in declared_fields() if f.metadata["secret"]]
    values += [v for k, v in config.kafka_options.items() if is_secret_kafka_option(k)]
    return [v for v in values if v]


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    import confluent_kafka
    import pyspark

    return {
        "service": __version__,
        "spark": pyspark.__version__,
        "librdkafka": confluent_kafka.libversion()[0],
        "confluent_kafka": confluent_kafka.version()[0],
        "pyarrow": version("pyarrow"),  # not imported: it is not needed before the JVM's launch
        "python": sys.version.split()[0],
    }


def main(args: argparse.Namespace) -> int:
    hold_stop_signals()  # before any import can start a thread; released once the service handles them
    # `kill -USR1 <pid>` writes every thread's Python stack to stderr: how a service that is alive but
    # makes no progress is diagnosed (stacks hold file and function names, never setting values).
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    from sink_service.config import ConfigError, load_config
    from sink_service.logs import configure

    try:
        config = load_config(os.environ)
    except ConfigError as exc:
        print(f"sink-service: {exc}", file=sys.stderr)
        print("See the configuration reference in README.md.", file=sys.stderr)
        return 2
    from sink_service.startup.java_home import JavaNotFound, require_java

    try:
        require_java()
    except JavaNotFound as exc:
        print(f"sink-service: {exc}", file=sys.stderr)
        return 2
    configure(config.log_level, _secrets(config), json_format=config.log_format == "json")
    versions = _versions()
    log.info("starting kafka-parquet-sink %s", versions, extra={"fields": {"event": "start", **versions}})
    log.info("configuration %s", config.masked(), extra={"fields": {"event": "config", "config": config.masked()}})
    from sink_service.driver.service import SinkService

    return SinkService(config, versions).run()

