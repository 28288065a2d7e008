"""`python -m sink_service.dead_letters`: the documented command, kept at its name.

The code is sink_service/task/dead_letters.py."""

import sys

from sink_service.task.dead_letters import main

if __name__ == "__main__":
    sys.exit(main())
