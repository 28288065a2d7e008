"""One line of `sink-service check`: what was probed, how it went, the setting to fix."""

from __future__ import annotations

from dataclasses import dataclass

OK, FAIL, WARN, SKIP = "OK", "FAIL", "WARN", "SKIP"


@dataclass
class Probe:
    """One line of the check: what was probed, how it went, and what to change when it failed."""

    status: str  # OK, FAIL, WARN (works, but look) or SKIP (not probed, not a failure)
    what: str
    reason: str = ""
    fix: str | None = None  # a SINK_* setting, or what else to change
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return self.status == FAIL

    def line(self) -> str:
        if self.status == OK:
            return f"OK {self.what}" + (f" ({self.reason})" if self.reason else "")
        text = f"{self.status} {self.what}: {self.reason}"
        return text + (f" — fix {self.fix}" if self.fix else "")
