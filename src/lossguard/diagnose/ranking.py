"""Rank the catalog's causes for a signature, given what is known about the run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lossguard.core import versions
from lossguard.diagnose.catalog import CAUSES

_MAX_CAUSES = 5
_MIN_CONFIDENCE = 0.02


@dataclass(slots=True)
class Cause:
    id: str
    title: str
    confidence: float
    evidence: list[str] = field(default_factory=list)
    fix: str = ""
    confirm: str = ""
    links: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "confidence": round(self.confidence, 3),
                "evidence": self.evidence + self.links, "fix": self.fix, "confirm": self.confirm}


def _holds(actual: Any, op: str, expected: Any) -> bool | None:
    """True/False when the condition can be judged, None when the fact is unknown."""
    if actual is None:
        return None
    if op == "==":
        return actual == expected
    if op == "in":
        return actual in expected
    if op == ">=":
        return isinstance(actual, (int, float)) and actual >= expected
    if op == "<=":
        return isinstance(actual, (int, float)) and actual <= expected
    if op == "version_in":
        low, high = expected
        return versions.in_range(str(actual), low, high)
    raise ValueError(f"unknown condition operator {op!r}")


def rank_causes(signature: str, context: dict[str, Any], origins: dict[str, str]) -> list[Cause]:
    scored: list[Cause] = []
    for cause in CAUSES:
        prior = cause["signatures"].get(signature)
        if not prior:
            continue
        score, evidence = prior, []
        for key, op, expected, factor, reason in cause["conditions"]:
            value = context.get(key)
            if _holds(value, op, expected):
                score *= factor
                if reason:
                    origin = origins.get(key)
                    evidence.append(reason.format(value=value) + (f" [{origin}]" if origin else ""))
        scored.append(Cause(id=cause["id"], title=cause["title"], confidence=score, evidence=evidence,
                            fix=cause["fix"], confirm=cause["confirm"], links=list(cause["evidence"])))
    total = sum(c.confidence for c in scored) or 1.0
    for cause in scored:
        cause.confidence /= total
    scored.sort(key=lambda c: -c.confidence)
    return [c for c in scored if c.confidence >= _MIN_CONFIDENCE][:_MAX_CAUSES]
