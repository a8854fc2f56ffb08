"""Rank the catalog's causes for a signature, given what is known about the run.

A cause's score is its prior for the signature times the factor of every condition that holds. Conditions
with a factor above 1 are evidence *for* it, below 1 evidence *against* it; both are shown. The scores are
not calibrated probabilities, so the user reads a rank word (likely / possible / unlikely) from the cause's
share of the total, never a percentage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lossguard.diagnose.catalog import CAUSES, CauseRule
from lossguard.knowledge.conditions import RunEvidence

_MAX_CAUSES = 5
_MIN_SHARE = 0.02
# share of the total score -> rank word (uncalibrated: words, not percentages)
_LIKELY, _POSSIBLE = 0.5, 0.15


def rank_word(share: float) -> str:
    return "likely" if share >= _LIKELY else "possible" if share >= _POSSIBLE else "unlikely"


@dataclass(slots=True)
class Cause:
    id: str
    title: str
    confidence: float  # share of the total score among the ranked causes (for ordering; shown as a word)
    evidence: list[str] = field(default_factory=list)
    fix: str = ""
    confirm: str = ""
    links: list[str] = field(default_factory=list)
    against: list[str] = field(default_factory=list)

    @property
    def likelihood(self) -> str:
        return rank_word(self.confidence)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "confidence": self.likelihood, "score": round(self.confidence, 3),
                "evidence": self.evidence + self.links, "against": self.against, "fix": self.fix,
                "confirm": self.confirm}


def score_cause(rule: CauseRule, signature: str, run: RunEvidence) -> Cause | None:
    prior = rule.priors.get(signature)
    if not prior:
        return None
    score, supports, against = prior, [], []
    for condition in rule.conditions:
        holds, actual = condition.judge(run)
        if not holds:
            continue
        score *= condition.factor
        if condition.reason:
            (supports if condition.supports else against).append(condition.explain(actual, run))
    issue = rule.issue
    return Cause(id=issue.id, title=issue.title, confidence=score, evidence=supports, fix=issue.fix,
                 confirm=issue.confirm, links=list(issue.sources), against=against)


def rank_causes(signature: str, run: RunEvidence) -> list[Cause]:
    scored = [c for c in (score_cause(rule, signature, run) for rule in CAUSES) if c is not None]
    total = sum(c.confidence for c in scored) or 1.0
    for cause in scored:
        cause.confidence /= total
    scored.sort(key=lambda c: -c.confidence)
    return [c for c in scored if c.confidence >= _MIN_SHARE][:_MAX_CAUSES]
