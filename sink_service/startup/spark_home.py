"""The local Spark installation the driver starts: the jars pip installed, prepared to start fast.

Three costs dominate Spark's start-up here, and all are paid once per installation instead of at
every start (`python -m sink_service.spark_home`; `scripts/bootstrap.sh` and the Dockerfile run it):

1. **Python workers compile PySpark from a zip.** Spark puts `$SPARK_HOME/python/lib/pyspark.zip`
   first on every Python worker's path, and Python caches no bytecode for zipped sources, so each
   of the half-dozen Python processes Spark starts before the first batch compiles PySpark again:
   1.05 s instead of 0.23 s per process on this machine. The prepared SPARK_HOME links only `bin`
   and the jars of the installed pyspark, so workers import the installed, compiled package.
2. **The JVM loads some 20,000 classes from jars**, parsing and verifying each, mostly on one
   thread. A class-data archive (AppCDS) written by a training run holds them ready to map.
3. **MLlib registers its SQL functions in every new session.** Its jar declares a session
   extension that builds Scala reflection's runtime universe and encoders: a quarter of the JVM's
   sampled start-up (JFR), ~0.3 s. The prepared `jars` directory links every jar but MLlib's,
   which the service never uses.

All are accelerators only: without them (or with an archive from another JVM) Spark starts as
before, just slower. A SPARK_HOME set by the user is always respected.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
from pathlib import Path

import pyspark

from sink_service.startup import java_home

log = logging.getLogger(__name__)

AUTO = "auto"
OFF = "off"
ARCHIVE_NAME = "classes.jsa"
# What spark-submit needs: `bin`, and `jars` without MLlib (item 3); not python/lib with the zips.
LEFT_OUT_JARS = ("spark-mllib_*.jar", "spark-mllib-local_*.jar")
_LAYOUT = 2  # part of the prepared directory's name: a changed layout is prepared afresh
# Skipped classes (signed jars, generated accessors) are expected; they are loaded as usual.
QUIET_CDS_LOGS = ("-Xlog:cds=off", "-Xlog:cds+dynamic=off")


def _pyspark_home() -> Path:
    return Path(pyspark.__file__).parent


def _java() -> str:
    return os.path.realpath(java_home.resolve_java())


def prepared_dir() -> Path:
    """Inside the installation (the virtualenv), named after the JVM and the Spark jars it serves."""
    jars = _pyspark_home() / "jars"
    java = _java()
    stamp = f"{java}|{_mtime(java)}|{pyspark.__version__}|{jars}|{_mtime(jars)}|{_LAYOUT}"
    key = hashlib.sha256(stamp.encode()).hexdigest()[:12]
    return Path(sys.prefix) / "share" / "kafka-parquet-sink" / f"spark-{pyspark.__version__}-{key}"


def _mtime(path: str | Path) -> int:
    try:
        return int(os.stat(path).st_mtime)
    except OSError:
        return 0


def archive_path(setting: str, directory: Path | None = None) -> Path | None:
    """The archive named by `SINK_SPARK_CLASS_ARCHIVE`: `auto`, a path, or `off`."""
    if setting in ("", OFF):
        return None
    return (directory or prepared_dir()) / ARCHIVE_NAME if setting == AUTO else Path(setting)


def activate(class_archive: str) -> list[str]:
    """Point Spark at the prepared home (unless SPARK_HOME is set); return the driver's JVM options."""
    directory = prepared_dir()
    home = directory / "home"
    if "SPARK_HOME" not in os.environ:
        if (home / "jars").is_dir():
            os.environ["SPARK_HOME"] = str(home)
        else:
            log.info("no prepared Spark home at %s: Spark starts slower (prepare it with "
                     "`python -m sink_service.spark_home`)", home)
    path = archive_path(class_archive, directory)
    if path is None or not path.is_file():
        if path is not None:
            log.info("no JVM class archive at %s: Spark starts slower", path)
        return []
    # -Xshare:auto: an archive that does not match this JVM or class path is ignored, never fatal.
    return [f"-XX:SharedArchiveFile={path}", "-Xshare:auto", *QUIET_CDS_LOGS]


# --- preparing ------------------------------------------------------------------------------------
def link_home(home: Path) -> None:
    home.mkdir(parents=True, exist_ok=True)
    bin_link = home / "bin"
    if not bin_link.is_symlink():
        bin_link.symlink_to(_pyspark_home() / "bin", target_is_directory=True)
    jars = home / "jars"
    jars.mkdir(exist_ok=True)
    for jar in sorted((_pyspark_home() / "jars").glob("*.jar")):
        link = jars / jar.name
        if not any(jar.match(pattern) for pattern in LEFT_OUT_JARS) and not link.is_symlink():
            link.symlink_to(jar)
