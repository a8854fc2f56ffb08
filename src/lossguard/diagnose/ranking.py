"""Rank the catalog's causes for a signature, given what is known about the run.

A cause's score is its prior for the signature times the factor of every condition that holds. Conditions
with a factor above 1 are evidence *for* it, below 1 evidence *against* it; both are shown, each with where
in the inputs it was read. The scores are not calibrated probabilities, so the user reads a rank word
(likely / possible / unlikely) from the cause's share of the total, never a percentage, and the word is
capped by what the inputs show: `likely` needs one of the cause's deciding facts (`shown_by`), a cause none
of whose deciding facts is known is at most `possible` (its `decide` says what would decide), and a cause a
fact rules out is `unlikely`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lossguard.diagnose.catalog import CAUSES, CauseRule
from lossguard.knowledge.conditions import NoneKnown, RunEvidence

_MAX_CAUSES = 5
_MIN_SHARE = 0.02
# share of the total score -> rank word (uncalibrated: words, not percentages). The likely threshold is
# measured on the real-log set (bench/real_logs.py prints the precision of "likely"; docs/analyze.md).
_LIKELY, _POSSIBLE = 0.5, 0.15
_WORDS = ("unlikely", "possible", "likely")


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
    links: list[str] = field(default_factory=list)  # documentation of the issue, never evidence
    against: list[str] = field(default_factory=list)
    shown: bool = False  # a deciding fact for it holds on this run's inputs
    ruled_out: bool = False  # a fact contradicts its mechanism
    decide: str = ""  # the facts that would decide, when none is known

    @property
    def likelihood(self) -> str:
        word = rank_word(self.confidence)
        cap = "unlikely" if self.ruled_out else "likely" if self.shown else "possible"
        return min(word, cap, key=_WORDS.index)

    @property
    def undecided(self) -> bool:
        """None of its deciding facts is known either way: the inputs cannot tell whether it applies."""
        return not self.shown and not self.ruled_out and bool(self.decide)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "confidence": self.likelihood, "score": round(self.confidence, 3),
                "evidence": self.evidence, "against": self.against, "fix": self.fix, "confirm": self.confirm,
                "decided_by": self.decide if self.undecided else None, "references": self.links}


def score_cause(rule: CauseRule, signature: str, run: RunEvidence) -> Cause | None:
    prior = rule.priors.get(signature)
    if not prior:
        return None
    score, supports, against, ids_that_held = prior, [], [], set()
    for condition in rule.all_conditions:
        holds, actual = condition.judge(run)
        if not holds:
            continue
        ids_that_held.add(id(condition))  # conditions hold lists (`in [1, 2]`): not hashable themselves
        score *= condition.factor
        if condition.reason and not isinstance(condition.subject, NoneKnown):  # an absence is no evidence
            (supports if condition.supports else against).append(condition.explain(actual, run))
    issue = rule.issue
    return Cause(id=issue.id, title=issue.title, confidence=score, evidence=supports, fix=issue.fix,
                 confirm=issue.confirm, links=list(issue.sources), against=against,
                 shown=any(id(c) in ids_that_held for c in rule.shown_by),
                 ruled_out=any(id(c) in ids_that_held for c in rule.ruled_out_by), decide=rule.decide)


def rank_causes(signature: str, run: RunEvidence) -> list[Cause]:
    scored = [c for c in (score_cause(rule, signature, run) for rule in CAUSES) if c is not None]
    total = sum(c.confidence for c in scored) or 1.0
    for cause in scored:
        cause.confidence /= total
    scored.sort(key=lambda c: -c.confidence)
    return [c for c in scored if c.confidence >= _MIN_SHARE][:_MAX_CAUSES]
