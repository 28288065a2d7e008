#!/usr/bin/env bash
# Run the service on embedded defaults: a local broker, a local EMS-compatible endpoint, sample orders.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/python -m devkit.demo "$@"
