"""`sink-service [run|check|verify|offsets] …`: one console script, one argument parser.

Each subcommand lives in its own module with `add_arguments(parser)` and `main(args) -> int`, and is
imported only when chosen, so `--help` and `--version` answer at once and `run` keeps its lean start.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

from sink_service import __version__

# name -> one-line help; the module is sink_service.cli.<name>
SUBCOMMANDS: dict[str, str] = {
    "run": "start the service (the default): configured only by SINK_* environment variables",
    "check": "probe the configured broker, topics, group, registry and target before deploying (exit 0 OK, 3 not)",
    "verify": "compare the target with the topics' latest record per key up to the group's committed offsets, "
              "rows ahead of them with the records past them (exit 0 equal, 1 not)",
    "offsets": "show the group's committed offsets and lag; move them (time, earliest, latest) while stopped",
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sink-service",
        description="Kafka -> Parquet -> upsert sink. Every subcommand reads the SINK_* environment "
                    "variables (see the configuration reference in README.md).",
    )
    parser.add_argument("--version", action="version", version=f"kafka-parquet-sink {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="{" + ",".join(SUBCOMMANDS) + "}")
    for name, summary in SUBCOMMANDS.items():
        sub = commands.add_parser(name, help=summary, description=summary)
        _module(name).add_arguments(sub)
    return parser


def _module(name: str) -> ModuleType:
    return importlib.import_module(f"sink_service.cli.{name}")


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if not arguments:
        # The common case, and the container's entry point: no parser, no subcommand imports.
        from sink_service.cli import run

        return run.main(argparse.Namespace())
    args = _parser().parse_args(arguments)
    return _module(args.command or "run").main(args)
