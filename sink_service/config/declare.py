"""How a setting is declared: one dataclass field with its environment name, default, doc and secrecy."""

from __future__ import annotations

from dataclasses import field
from typing import Any

MASK = "*****"


class ConfigError(Exception):
    """Raised at startup with every configuration problem found, one per line."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{len(problems)} configuration problem(s):\n{lines}")


def setting(
    env: str,
    doc: str,
    default: Any = None,
    *,
    secret: bool = False,
    choices: tuple[str, ...] | None = None,
    minimum: int | None = None,
    group: str = "General",
) -> Any:
    """Declare one setting as a dataclass field carrying its env name and documentation."""
    meta = {"env": env, "doc": doc, "secret": secret, "choices": choices, "minimum": minimum, "group": group}
    if isinstance(default, tuple | list):
        return field(default=tuple(default), metadata=meta)
    return field(default=default, metadata=meta)
