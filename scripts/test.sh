#!/usr/bin/env bash
# Run the whole test suite: unit, component and end-to-end (starts its own brokers and endpoints).
# Four pytest-xdist workers on two cores, each with its own broker and endpoint, sharing all tests: the
# end-to-end tests spend much of their time waiting (flush intervals, outages, session timeouts), so two
# workers left the cores about 40% idle (README, *Testing*). The 25 slowest tests are listed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
.venv/bin/ruff check .
# A worker that crashes (a segfault in a native library) ends the run at once: xdist replacing it
# left its tests unscheduled and the run waiting forever (seen once).
exec .venv/bin/python -m pytest -n "${SINK_TEST_WORKERS:-4}" --dist load --max-worker-restart=0 --durations=25 "$@"
