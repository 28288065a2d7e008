#!/usr/bin/env bash
# The benchmark in one command: bootstrap .venv, add the `bench` extra, run bench.run with any arguments given.
# bench.run itself creates bench/.venv-quix for Quix Streams (it pins an older confluent-kafka).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
if ! .venv/bin/python -c "import matplotlib, psutil" 2>/dev/null; then
  .venv/bin/python -m pip install --quiet --require-hashes -r requirements/bench.txt
fi
exec .venv/bin/python -m bench.run "$@"
