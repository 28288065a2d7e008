"""`python -m sink_service` / `sink-service`: see sink_service/cli/commands.py for the subcommands."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    from sink_service.cli.commands import main as dispatch

    return dispatch(argv)


if __name__ == "__main__":
    sys.exit(main())
