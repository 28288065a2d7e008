# syntax=docker/dockerfile:1
#
# kafka-parquet-sink: `python -m sink_service` (the Spark driver, local[*] by default) on Python 3.11
# and a headless Java 17 runtime.
#
#   docker build -t kafka-parquet-sink:0.1.0 .
#   docker run --rm -p 8080:8080 -e SINK_KAFKA_BOOTSTRAP_SERVERS=... -e SINK_TOPICS=... kafka-parquet-sink:0.1.0
#
# Base image: an exact tag, never `latest`. For reproducible builds also pin the digest the tag
# points to today, e.g.
#   docker buildx imagetools inspect python:3.11.11-slim-bookworm     # prints "Digest: sha256:..."
#   FROM python:3.11.11-slim-bookworm@sha256:<that digest> AS builder  # and the same in the runtime stage
# and let Renovate/Dependabot bump tag and digest together.

# --- builder: a venv with the locked dependencies and the project's wheel -------------------------
FROM python:3.11.11-slim-bookworm AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /src
RUN python -m venv /opt/venv

# Dependencies first (their own layer: pyspark is large and changes rarely), exactly the runtime lock:
# every package pinned and hash-checked (requirements/runtime.txt, made by requirements/compile.sh from
# pyproject.toml's [project.dependencies]); pip and setuptools from requirements/build.txt.
COPY pyproject.toml ./
COPY requirements/build.txt requirements/runtime.txt ./requirements/
RUN /opt/venv/bin/pip install --no-cache-dir --require-hashes -r requirements/build.txt \
    && /opt/venv/bin/pip install --no-cache-dir --require-hashes -r requirements/runtime.txt

# The project as a wheel: it packages sink_service, uploader and local_ems only (devkit/ and tests/
# are neither copied nor packaged), then installed alone (--no-deps: its dependencies are the lock's).
COPY sink_service ./sink_service
COPY uploader ./uploader
COPY local_ems ./local_ems
RUN /opt/venv/bin/pip wheel --no-cache-dir --no-deps --no-build-isolation -w /wheels . \
    && /opt/venv/bin/pip install --no-cache-dir --no-deps /wheels/*.whl \
    && /opt/venv/bin/python -c "import sink_service, uploader, local_ems"

# --- runtime: Python, a headless JRE, the venv; no compilers, no sources, no build files ----------
FROM python:3.11.11-slim-bookworm AS runtime

# openjdk-17-jre-headless from Debian bookworm. The man1 directory works around postinst scripts
# that expect it in slim images. JAVA_HOME gets an architecture-independent path (amd64, arm64).
# libnss-wrapper (100 kB): the entrypoint's passwd entry for an arbitrary uid (see below).
# No /tmp/sink here: the service creates its scratch directory itself, owned by whatever uid it runs
# as (it refuses one owned by another uid), in /tmp, which every uid may write (mode 1777).
RUN set -eux; \
    mkdir -p /usr/share/man/man1; \
    apt-get update; \
    apt-get install -y --no-install-recommends openjdk-17-jre-headless libnss-wrapper; \
    apt-get clean; \
    rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*; \
    ln -s "/usr/lib/jvm/java-17-openjdk-$(dpkg --print-architecture)" /usr/lib/jvm/java-17; \
    /usr/lib/jvm/java-17/bin/java -version; \
    groupadd --system --gid 10001 sink; \
    useradd --system --uid 10001 --gid 10001 --home-dir /home/sink --create-home --shell /usr/sbin/nologin sink

COPY --from=builder /opt/venv /opt/venv

# PYSPARK_PYTHON: Python workers (and, on a cluster, executors) run the venv's interpreter, the one
# that has the project installed. SINK_SCRATCH_DIR's parent must be writable by the service's uid (on
# Kubernetes /tmp is an emptyDir because the root filesystem is read-only).
ENV PATH=/opt/venv/bin:$PATH \
    JAVA_HOME=/usr/lib/jvm/java-17 \
    PYSPARK_PYTHON=/opt/venv/bin/python \
    PYSPARK_DRIVER_PYTHON=/opt/venv/bin/python \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    SINK_SCRATCH_DIR=/tmp/sink \
    SINK_HTTP_PORT=8080

# A Spark home whose Python workers import the installed (compiled) PySpark rather than its zip, and a
# JVM class-data archive (SINK_SPARK_CLASS_ARCHIVE=auto): together the first batch starts 6-14 s
# sooner. Built by a short local Spark run against this image's JVM and jars (about 40 s, 170 MB).
RUN python -m sink_service.spark_home

# Any uid: OpenShift (and `docker run --user N:0`) starts the container as an arbitrary uid in group 0
# that /etc/passwd does not know, and the JVM cannot log in without an entry ("Invalid UID"). The
# entrypoint gives it one through nss_wrapper, from /tmp: /etc/passwd stays read-only.
COPY --chmod=0755 deploy/image/entrypoint.sh /usr/local/bin/sink-entrypoint

# Spark may create spark-warehouse/ in the working directory: keep it on writable scratch.
WORKDIR /tmp

# The default user; any other uid works too (group 0 or not), see sink-entrypoint above.
USER 10001:10001

# /healthz, /readyz and /metrics
EXPOSE 8080

# No curl in slim images: probe /healthz with the venv's Python on port ${SINK_HTTP_PORT:-8080}
# (exec form, so the port is read by Python; any error or non-2xx status exits non-zero).
# SINK_HTTP_PORT=0 disables the HTTP server and therefore this check.
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % (os.environ.get('SINK_HTTP_PORT') or '8080'), timeout=4)"]

ENTRYPOINT ["/usr/local/bin/sink-entrypoint", "python", "-m", "sink_service"]
