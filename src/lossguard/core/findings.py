"""Findings are data: checks return them, reporters render them. No check prints or raises to report."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import IntEnum
from typing import Any


class Severity(IntEnum):
    INFO = 10
    WARNING = 20
    ERROR = 30
    CRITICAL = 40

    @classmethod
    def parse(cls, text: str) -> Severity:
        try:
            return cls[text.strip().upper()]
        except KeyError:
            names = ", ".join(s.name.lower() for s in cls)
            raise ValueError(f"unknown severity {text!r}; use one of: {names}") from None

    def __str__(self) -> str:
        return self.name.lower()


@dataclass(slots=True)
class Finding:
    code: str
    name: str
    severity: Severity
    message: str
    step: int | None = None
    rank: int | None = None
    # The failure signature this finding is evidence for (DESIGN.md ids), or None.
    signature: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
    # Where the evidence came from: `file:line`, a dotted config key, ...
    location: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["severity"] = str(self.severity)
        return out
