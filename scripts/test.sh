#!/usr/bin/env bash
# Run the whole test suite: unit, component and end-to-end (starts its own broker and endpoint).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
.venv/bin/ruff check .
exec .venv/bin/python -m pytest "$@"
