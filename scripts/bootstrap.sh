#!/usr/bin/env bash
# Create .venv and install the project with its test tools. Idempotent; safe to run every time.
# Needs Python 3.11+ with venv (Debian: apt-get install python3-venv) and Java 17 (openjdk-17-jre-headless).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
command -v java >/dev/null || { echo "Java 17 is required (Debian: apt-get install openjdk-17-jre-headless)" >&2; exit 1; }
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.installed-$(sha256sum pyproject.toml requirements.lock 2>/dev/null | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -c requirements.lock -e ".[test]"
  rm -f .venv/.installed-*
  touch "$stamp"
fi
# A Spark home and JVM class-data archive that make Spark start faster; once per installation (~40 s).
.venv/bin/python -m sink_service.spark_home
