"""Rank the catalog's causes for a signature from what each cause's mechanism predicts (diagnose/catalog.py).

For a signature, every cause with a prior for it is a rival of every other, and one more rival stands for
the causes the table does not list: it shows each clue at the clue's background rate. A clue the inputs
answer (true or false) multiplies each cause's score by how often that cause shows that answer (its stated
level, or the background where it states none); a clue the inputs do not answer changes nothing. A clue that
defines the signature (`symptom_of`) is left out: every cause of the signature shows it.

From the same statements, per cause and known clue:
- the clue is **for** the cause when the cause shows that answer clearly more often than its live rivals do
  on average, **against** it when clearly less often (both shown with where the fact was read);
- it **decides** for the cause when the cause shows that answer at least OFTEN while every live rival, and
  runs in general, show it at most RARELY: only then can the cause be called `likely`;
- it **rules the cause out** when the cause says ALWAYS and the answer is no, or NEVER and it is yes: the
  cause is then `unlikely` and ranked after every cause not ruled out.
The score shares are not calibrated probabilities: the user reads a rank word (likely / possible / unlikely),
never a percentage. A cause nothing decides is at most `possible`, and the report says what would decide
(the cause's asks that the inputs have not already answered).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lossguard.diagnose.catalog import CAUSES, CauseRule
from lossguard.diagnose.clues import ALWAYS, NEVER, OFTEN, RARELY, Clue
from lossguard.knowledge.conditions import RunEvidence

_MAX_CAUSES = 5
_MIN_SHARE = 0.02
# share of the total score -> rank word (uncalibrated: words, not percentages).
_LIKELY, _POSSIBLE = 0.5, 0.15
_WORDS = ("unlikely", "possible", "likely")
# "Clearly more / less often" for evidence lines (display only: the score uses the levels themselves): a fifth
# more, or five sixths of, the rivals' average.
_CLEARLY = 1.2


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
    shown: bool = False  # a known fact decides for it (the cause predicts it, its rivals rarely do)
    ruled_out: bool = False  # a known fact contradicts its mechanism
    decide: str = ""  # the facts that would decide and are not known yet

    @property
    def likelihood(self) -> str:
        word = rank_word(self.confidence)
        cap = "unlikely" if self.ruled_out else "likely" if self.shown else "possible"
        return min(word, cap, key=_WORDS.index)

    @property
    def undecided(self) -> bool:
        """No known fact decides or rules it out: the inputs cannot tell whether it applies."""
        return not self.shown and not self.ruled_out and bool(self.decide)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "confidence": self.likelihood, "score": round(self.confidence, 3),
                "evidence": self.evidence, "against": self.against, "fix": self.fix, "confirm": self.confirm,
                "decided_by": self.decide if self.undecided else None, "references": self.links}


@dataclass(frozen=True, slots=True)
class _Answer:
    clue: Clue
    holds: bool
    actual: Any


def _chance(rule: CauseRule | None, answer: _Answer) -> float:
    """How often `rule` (None: a cause the table does not list) shows this answer."""
    level = rule.level(answer.clue) if rule is not None else None
    return (level or answer.clue.background).chance(answer.holds)


def _contradicts(rule: CauseRule, answer: _Answer) -> bool:
    level = rule.level(answer.clue)
    return (level is ALWAYS and not answer.holds) or (level is NEVER and answer.holds)


def _answers(rules: list[CauseRule], signature: str, run: RunEvidence) -> list[_Answer]:
    """The known answers to every clue a rival states something about, symptoms of the signature left out."""
    seen: dict[str, Clue] = {}
    for rule in rules:
        for clue, _ in rule.predicts:
            if signature not in clue.symptom_of:
                seen.setdefault(clue.name, clue)
    answers = []
    for clue in seen.values():
        holds, actual = clue.judge(run)
        if holds is not None:
            answers.append(_Answer(clue, holds, actual))
    return answers


def _judge(rule: CauseRule, rivals: list[CauseRule | None], answers: list[_Answer], run: RunEvidence,
           prior: float) -> Cause:
    issue = rule.issue
    cause = Cause(id=issue.id, title=issue.title, confidence=prior, fix=issue.fix, confirm=issue.confirm,
                  links=list(issue.sources))
    for answer in answers:
        mine = _chance(rule, answer)
        cause.confidence *= mine
        if rule.level(answer.clue) is None:
            continue  # the cause says nothing about it: no evidence either way
        others = [_chance(rival, answer) for rival in rivals]
        average = sum(others) / len(others)
        line = answer.clue.explain(answer.holds, answer.actual, run)
        if _contradicts(rule, answer):
            cause.ruled_out = True
            cause.against.append(line)
        elif mine >= average * _CLEARLY:
            cause.evidence.append(line)
            cause.shown |= mine >= OFTEN.p and max(others) <= RARELY.p
        elif mine * _CLEARLY <= average:
            cause.against.append(line)
    open_asks = [ask.text for ask in rule.asks if not any(clue.judge(run)[0] is not None for clue in ask.clues)]
    cause.decide = "; ".join(open_asks)
    return cause


def rank_causes(signature: str, run: RunEvidence) -> list[Cause]:
    rules = [rule for rule in CAUSES if rule.priors.get(signature)]
    answers = _answers(rules, signature, run)
    alive = [rule for rule in rules if not any(_contradicts(rule, a) for a in answers)]
    scored = []
    for rule in rules:
        rivals: list[CauseRule | None] = [r for r in alive if r is not rule] + [None]  # None: an unlisted cause
        scored.append(_judge(rule, rivals, answers, run, rule.priors[signature]))
    total = sum(c.confidence for c in scored) or 1.0
    for cause in scored:
        cause.confidence /= total
    scored.sort(key=lambda c: (c.ruled_out, -c.confidence))
    return [c for c in scored if c.confidence >= _MIN_SHARE][:_MAX_CAUSES]
