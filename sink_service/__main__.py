"""`python -m sink_service` / `sink-service`: see sink_service/cli/commands.py for the subcommands."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    from sink_service.cli.commands import main as dispatch

    return dispatch(argv)


def _exit(code: int) -> None:
    """Leave without the interpreter's finalization: by now every commit is made, Spark is stopped and the logs
    are flushed here, while native threads of the libraries (librdkafka, py4j's gateway, delta-rs's runtime) may
    still be winding down, and tearing the interpreter down under them ended a service that had stopped cleanly
    with SIGSEGV instead of its exit code (a CI rehearsal under load, the refused-login e2e)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run() -> None:
    """The `sink-service` command and `python -m sink_service`."""
    _exit(main())


if __name__ == "__main__":
    run()
