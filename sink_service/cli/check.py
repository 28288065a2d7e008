"""`sink-service check`: will this configuration work? Asked before deploying, not found in the logs after.

It loads the configuration as the service does (every problem at once, exit 2), then probes what
it can without side effects that matter, one line per probe:

    OK <what> (<detail>)
    FAIL <what>: <reason> — fix <SETTING>
    WARN <what>: <reason> — fix <...>      works, but look (not a failure)
    SKIP <what>: <reason>                  not probed (not a failure)

Exit 0 when nothing failed, 3 otherwise (the service's own exit code for a fatal configuration
problem), 2 on a configuration error. `--json` prints one document instead.

Kafka, the schema registry and the target are probed side by side, each probe within `--timeout`,
so the slowest unreachable thing costs one timeout, not the sum. Spark is never started or imported:
the check runs in a second on a laptop or in an init container. Secrets never reach the output: the
probes redact what they quote, and every line is passed through the configured secrets once more.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from sink_service.check.probe import Probe
    from sink_service.config import SinkConfig

EXIT_OK = 0
EXIT_CONFIG = 2
EXIT_FAILED = 3
PROG = "sink-service check"
DEFAULT_TIMEOUT_S = 10.0
# A backstop over the probes' own deadlines: a group of probes still running after this many
# timeouts (plus a margin) is reported as not answering, and left behind in its daemon thread.
_GROUP_TIMEOUTS = 6


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="one JSON document instead of one line per probe")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                        help=f"how long each probe may wait for an answer (default {DEFAULT_TIMEOUT_S:g})")


def main(args: argparse.Namespace) -> int:
    return run(args, os.environ, sys.stdout, sys.stderr)


def run(args: argparse.Namespace, environ: Mapping[str, str], out: TextIO, err: TextIO) -> int:
    """The command with its environment and streams given, for tests."""
    from sink_service.config import ConfigError, load_config

    started = time.monotonic()
    if args.timeout <= 0:
        print(f"{PROG}: --timeout must be more than 0 seconds", file=err)
        return EXIT_CONFIG
    try:
        config = load_config(environ)
    except ConfigError as exc:
        print(f"{PROG}: {exc}", file=err)
        print("See the configuration reference in README.md.", file=err)
        if args.json:
            print(json.dumps({"ok": False, "exit_code": EXIT_CONFIG, "config_problems": exc.problems}, indent=2),
                  file=out)
        return EXIT_CONFIG
    probes = probe_all(config, args.timeout)
    secrets = configured_secrets(config)
    failed = sum(p.failed for p in probes)
    code = EXIT_FAILED if failed else EXIT_OK
    elapsed = time.monotonic() - started
    if args.json:
        document = {"ok": not failed, "exit_code": code, "seconds": round(elapsed, 3),
                    "probes": [{"status": p.status, "what": _safe(p.what, secrets), "reason": _safe(p.reason, secrets),
                                "fix": p.fix, "seconds": p.seconds} for p in probes]}
        print(json.dumps(document, indent=2), file=out)
    else:
        for probe in probes:
            print(_safe(probe.line(), secrets), file=out)
        counts = {s: sum(p.status == s for p in probes) for s in ("OK", "FAIL", "WARN", "SKIP")}
        summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        print(f"{PROG}: {summary} in {elapsed:.1f} s; exit {code}", file=err)
    return code


def probe_all(config: SinkConfig, timeout_s: float) -> list[Probe]:
    """Every probe, Kafka, registry and target side by side; the lines in that fixed order."""
    from sink_service.check.kafka_probes import kafka_probes
    from sink_service.check.probe import OK, Probe
    from sink_service.check.target_probes import registry_probe, target_probes
    from sink_service.config import REGISTRY_FORMATS

    topics = f"SINK_TOPIC_PATTERN={config.topic_pattern}" if config.topic_pattern else \
        f"{len(config.topics)} topic(s)"
    first = Probe(OK, "configuration", f"SINK_TARGET={config.target}, {topics}, group {config.group_id}")
    groups: list[tuple[str, Callable[[Callable[[Probe], None]], None]]] = [
        ("Kafka", lambda report: kafka_probes(config, timeout_s, report))]
    if config.value_format in REGISTRY_FORMATS or config.key_format in REGISTRY_FORMATS:
        groups.append(("schema registry", lambda report: report(_timed(lambda: registry_probe(config, timeout_s)))))
    groups.append(("target", lambda report: [report(p) for p in _timed_list(lambda: target_probes(config, timeout_s))]))
    results = [_Group(name, body) for name, body in groups]
    for group in results:
        group.start()
    deadline = time.monotonic() + _GROUP_TIMEOUTS * timeout_s + 5
    for group in results:
        group.join(max(0.0, deadline - time.monotonic()))
    return [first, *(probe for group in results for probe in group.lines(timeout_s))]


class _Group(threading.Thread):
    """One group of probes in a daemon thread: a probe stuck past every deadline cannot hold the exit."""

    def __init__(self, name: str, body: Callable[[Callable[[Probe], None]], None]):
        super().__init__(name=f"check-{name}", daemon=True)
        self.label = name
        self.body = body
        self.reported: list[Probe] = []
        self.crashed: BaseException | None = None

    def run(self) -> None:
        try:
            self.body(self.reported.append)
        except Exception as exc:  # a probe's own bug is one FAIL line, not a traceback over the others
            self.crashed = exc

    def lines(self, timeout_s: float) -> list[Probe]:
        from sink_service.check.probe import FAIL, Probe

        lines = list(self.reported)
        if self.is_alive():
            lines.append(Probe(FAIL, self.label, f"still no answer after {_GROUP_TIMEOUTS * timeout_s + 5:g} s"))
        elif self.crashed is not None:
            lines.append(Probe(FAIL, self.label, f"the probe itself failed: {type(self.crashed).__name__}: "
                                                 f"{self.crashed}"))
        return lines


def _timed(probe: Callable[[], Probe]) -> Probe:
    started = time.monotonic()
    result = probe()
    result.seconds = round(time.monotonic() - started, 3)
    return result


def _timed_list(probe: Callable[[], list[Probe]]) -> list[Probe]:
    started = time.monotonic()
    results = probe()
    for result in results:
        result.seconds = round((time.monotonic() - started) / max(1, len(results)), 3)
    return results


def configured_secrets(config: SinkConfig) -> list[str]:
    """Every secret value of the configuration, and the parts of those that are credentials."""
    from sink_service.config import declared_fields, is_secret_kafka_option
    from uploader.masking import authorization_secrets

    values: list[str] = []
    for f in declared_fields():
        value = getattr(config, f.name)
        if f.metadata["secret"] and isinstance(value, str) and value:
            values.extend(authorization_secrets(value))
            values.append(value.partition(":")[2])  # the password of `user:password`
    values.extend(v for k, v in config.kafka_options.items() if is_secret_kafka_option(k) and v)
    return sorted({v for v in values if v}, key=len, reverse=True)


def _safe(text: str, secrets: list[str]) -> str:
    from uploader.masking import redact

    return redact(text, secrets)
