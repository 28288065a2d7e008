"""`load_config`: SINK_* variables parsed, unknown names caught, every check run, all problems at once."""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Mapping
from typing import Any

from sink_service.config.checks import _CHECKS, _check_kafka
from sink_service.config.declare import MASK, ConfigError
from sink_service.config.kafka import KAFKA_PASSTHROUGH_PREFIX
from sink_service.config.settings import SinkConfig, _declared_envs, declared_fields, kafka_passthrough

# SINK_* names that are not settings: the test harness's broker choice (devkit/brokers.py) and worker
# count (scripts/test.sh). A developer's shell may export them while it also runs the service or
# `python -m uploader` (the tests do: SINK_TEST_WORKERS=4 once made a parked-file test's re-push fail).
NON_SETTING_NAMES = frozenset({"SINK_TEST_BROKER", "SINK_TEST_BOOTSTRAP", "SINK_TEST_WORKERS"})


def _base_type(name: str) -> Any:
    """`int | None` -> int; `tuple[str, ...]` -> tuple."""
    annotation = typing.get_type_hints(SinkConfig)[name]
    origin = typing.get_origin(annotation)
    if origin in (types.UnionType, typing.Union):
        return next(a for a in typing.get_args(annotation) if a is not type(None))
    return origin or annotation


def _parse_value(f: dataclasses.Field, raw: str) -> Any:
    kind = _base_type(f.name)
    meta = f.metadata
    if kind is tuple:
        return tuple(part.strip() for part in raw.split(",") if part.strip())
    if kind is bool:
        if raw.strip().lower() not in ("true", "false"):
            raise ValueError(f"must be true or false, got {raw!r}")
        return raw.strip().lower() == "true"
    if kind is int:
        try:
            value = int(raw.strip())
        except ValueError:
            raise ValueError(f"must be a whole number, got {raw!r}") from None
        if meta["minimum"] is not None and value < meta["minimum"]:
            raise ValueError(f"must be at least {meta['minimum']}, got {value}")
        return value
    value = raw.strip()
    if meta["choices"] and value not in meta["choices"]:
        raise ValueError(f"must be one of {', '.join(meta['choices'])}; got {value!r}")
    return value


def load_config(environ: Mapping[str, str], *, scope: str = "service") -> SinkConfig:
    """Build and validate the configuration; raise `ConfigError` listing every problem.

    `scope="target"` is for tools that only upload or read files (the uploader CLI): the Kafka
    settings are not required then.
    """
    if scope not in ("service", "target"):
        raise ValueError(f"unknown configuration scope {scope!r}")
    checks = _CHECKS if scope == "service" else tuple(c for c in _CHECKS if c is not _check_kafka)
    problems: list[str] = []
    values: dict[str, Any] = {}
    for f in declared_fields():
        raw = environ.get(f.metadata["env"])
        if raw is None or raw.strip() == "":
            continue
        try:
            values[f.name] = _parse_value(f, raw)
        except ValueError as exc:
            shown = MASK if f.metadata["secret"] else raw
            problems.append(f"{f.metadata['env']}={shown!s}: {exc}")
    values["kafka_options"] = kafka_passthrough(environ)
    problems.extend(_unknown_names(environ))
    config = SinkConfig(**values)
    problems.extend(problem for check in checks for problem in check(config))
    if problems:
        raise ConfigError(problems)
    return config


def _unknown_names(environ: Mapping[str, str]) -> list[str]:
    """A misspelt name would otherwise run silently on the default. Values are not shown: a
    misspelt secret setting still holds the secret."""
    known = sorted(_declared_envs())
    problems = []
    for name in sorted(environ):
        if (not name.startswith("SINK_") or name.startswith(KAFKA_PASSTHROUGH_PREFIX)
                or name in known or name in NON_SETTING_NAMES):
            continue
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"; did you mean {close[0]}?" if close else "; see the configuration reference"
        problems.append(f"{name} is not a setting (value not shown){hint}")
    return problems
