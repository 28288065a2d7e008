"""Runtime settings: Spark master, HTTP port, logging, class archive, shutdown, scratch."""

from __future__ import annotations

from dataclasses import dataclass

from sink_service.config.declare import setting


@dataclass(frozen=True)
class RuntimeSettings:
    """Runtime settings: part of `SinkConfig`."""

    spark_master: str = setting(
        "SINK_SPARK_MASTER", "Spark master URL: `local[*]` or `spark://host:7077`.", "local[*]",
        group="Runtime")
    spark_auth_secret: str | None = setting(
        "SINK_SPARK_AUTH_SECRET", "Shared secret for Spark's RPC authentication and AES encryption "
        "(`spark.authenticate`, `spark.network.crypto.enabled`), which the service turns on whenever "
        "`SINK_SPARK_MASTER` is not `local`: task recipes carry the upload credentials to executors. "
        "Required with a standalone master (`spark://`), whose master and workers must run with the "
        "same secret (`SPARK_DAEMON_JAVA_OPTS=-Dspark.authenticate=true` and the secret in their "
        "`_SPARK_AUTH_SECRET` environment variable, never on a command line); YARN and Kubernetes "
        "generate one when it is unset. The service hands it to its JVM over py4j, so no process "
        "shows it in `ps`.",
        secret=True, group="Runtime")
    http_port: int = setting(
        "SINK_HTTP_PORT", "Port of `/healthz` and `/readyz`; 0 disables the HTTP server.", 8080,
        minimum=0, group="Runtime")
    http_host: str = setting(
        "SINK_HTTP_HOST", "Address the HTTP server binds to. `0.0.0.0` (every interface) lets "
        "Kubernetes probes and a Prometheus scrape reach it; `127.0.0.1` keeps it on the host, or "
        "name one interface's address (`::` for every IPv6 interface). Executors post their live "
        "upload signals to it, authenticated by a per-start token in a header; a request without "
        "the token, or with a missing, invalid or over-64 KiB length, is refused before its body "
        "is read. On a cluster, bind an address the executors reach (with `127.0.0.1` their "
        "signals are lost and retries are counted when tasks end).",
        "0.0.0.0", group="Runtime")
    log_level: str = setting(
        "SINK_LOG_LEVEL", "Service log level.", "INFO",
        choices=("DEBUG", "INFO", "WARNING", "ERROR"), group="Runtime")
    log_format: str = setting(
        "SINK_LOG_FORMAT", "`text`, or `json` for one JSON object per line with stable field names.", "text",
        choices=("text", "json"), group="Runtime")
    spark_log_level: str = setting(
        "SINK_SPARK_LOG_LEVEL", "Log level of Spark's own (JVM) logging.", "WARN",
        choices=("ERROR", "WARN", "INFO", "DEBUG"), group="Runtime")
    spark_class_archive: str = setting(
        "SINK_SPARK_CLASS_ARCHIVE", "JVM class-data archive that makes Spark start about 3 s faster: "
        "`auto` (the one `python -m sink_service.spark_home` builds inside the installation; "
        "`scripts/bootstrap.sh` and the Docker image run it), a file path, or `off`. "
        "A missing or outdated archive only makes start-up slower.", "auto", group="Runtime")
    shutdown_timeout_ms: int = setting(
        "SINK_SHUTDOWN_TIMEOUT_MS", "On SIGTERM, how long in-flight uploads may take to finish "
        "and commit before the service stops anyway.", 30_000, minimum=0, group="Runtime")
    restart_backoff_max_ms: int = setting(
        "SINK_RESTART_BACKOFF_MAX_MS", "Longest wait between replays of a failed micro-batch "
        "(backoff doubles from 1 s).", 60_000, minimum=1000, group="Runtime")
    scratch_dir: str = setting(
        "SINK_SCRATCH_DIR", "Local scratch space (Spark checkpoints, files being written). "
        "Nothing in it matters across restarts.", "/tmp/kafka-parquet-sink", group="Runtime")
