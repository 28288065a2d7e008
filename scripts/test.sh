#!/usr/bin/env bash
# Run the whole test suite: unit, component and end-to-end (starts its own brokers and endpoints).
# Two pytest-xdist workers, each with its own broker and endpoint; the end-to-end tests run one at a
# time on one of them (tests/conftest.py says why). The 25 slowest tests are listed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
.venv/bin/ruff check .
# A worker that crashes (a segfault in a native library) ends the run at once: xdist replacing it
# left the end-to-end group unscheduled and the run waiting forever (seen once).
exec .venv/bin/python -m pytest -n "${SINK_TEST_WORKERS:-2}" --dist loadgroup --max-worker-restart=0 --durations=25 "$@"
