#!/usr/bin/env bash
# Regenerate the hashed lock files from pyproject.toml (and java.in, lint.in, build.in) with uv's pip compile:
#   python3 -m venv /tmp/uv && /tmp/uv/bin/pip install uv && PATH=/tmp/uv/bin:$PATH bash requirements/compile.sh
# Pins already in a lock are kept unless pyproject.toml no longer allows them; to move one on, add
# `--upgrade-package NAME` (or `--upgrade` for all) to the command line: bash requirements/compile.sh --upgrade
# One lock for every Python >= 3.11 and platform (--universal: environment markers, all wheels' hashes);
# test.txt and bench.txt are constrained to runtime.txt's pins, so the image and the tests run the same versions.
set -euo pipefail
cd "$(dirname "$0")/.."
compile=(uv pip compile --quiet --universal --python-version 3.11 --generate-hashes "$@")
"${compile[@]}" pyproject.toml -o requirements/runtime.txt
"${compile[@]}" pyproject.toml --extra test -c requirements/runtime.txt -o requirements/test.txt
"${compile[@]}" pyproject.toml --extra test --extra bench -c requirements/test.txt -o requirements/bench.txt
"${compile[@]}" requirements/java.in -o requirements/java.txt
"${compile[@]}" requirements/lint.in -o requirements/lint.txt
"${compile[@]}" requirements/build.in -o requirements/build.txt
