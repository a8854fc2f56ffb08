"""A loss pinned at chance: ln(k), the cross-entropy of a uniform guess over k classes.

A classifier (a multiple-choice head, a k-way task) that predicts the same probability for every class has a
loss of exactly ln(k) on every example, whatever the labels: 1.3863 for 4 options. A loss that sits there
from its first log to its last has learned nothing, however normal its LR schedule and grad norms look
(QuALITY's LRQA baseline: eval loss 1.38629 for ten evaluations). A loss that passes through ln(k) on its way
down is not stuck there, so only a run at chance from the first log of its kind to the last counts.

Kept to what can be told apart: k from 3 to 10, each within 0.2% of ln(k). The bands are then narrow and far
apart (ln(11/10) = 0.095 between the last two, against 0.005 of band), so a loss that moves at all leaves its
band. k = 2 is left out: a pairwise preference loss (DPO, a reward model) starts at exactly ln 2 by
construction and leaves it slowly, and a vocabulary-sized k cannot be told from any flat LM loss.
"""

from __future__ import annotations

import bisect
import math

from lossguard.core.findings import Finding, Severity
from lossguard.core.profile import RankProfile
from lossguard.core.records import EVAL, Record
from lossguard.detectors._base import DetectorBase, is_rl
from lossguard.detectors.registry import register

CLASSES = range(3, 11)
TOLERANCE = 0.002  # relative to ln(k)
CHANCE_LOGS = 5  # logs at chance, from the first of their kind, that make a run
# A log whose first step is later than this does not show where the loss started (LOSS004's same bound).
_FROM_START = 100
_FELL = 0.9  # a train loss whose last logs average under 90% of its first ones is learning something
_EDGES = tuple(edge for k in CLASSES for edge in (math.log(k) * (1 - TOLERANCE), math.log(k) * (1 + TOLERANCE)))


def chance_classes(value: float | None) -> int | None:
    """k when `value` is ln(k) for k in CLASSES (within TOLERANCE), else None."""
    if value is None or not 0 < value < _EDGES[-1]:  # NaN compares False
        return None
    index = bisect.bisect(_EDGES, value)
    return CLASSES[index // 2] if index & 1 else None


@register
class LossAtChance(DetectorBase):
    """LOSS010: the train or eval loss is ln(k) for a small k (3-10) from the first log of its kind to the last,
    five logs or more: the model predicts every class with the same probability, it is not learning. Fix:
    check that the labels reach the loss (the label column, the answer index), the learning rate, and that the
    classifier head is trained. When the train loss falls meanwhile while the eval loss stays at chance, the
    model fits its training set without generalising: a warning.

    Evaluations come one by one; the training loss is read from the engine's loss profile at the end (its
    first and last logs at ln(k), and never under that band: a run that learned anything went below chance),
    so no train record is routed here."""

    wants = frozenset({"eval_loss"})
    spared_when: dict = {}  # evaluations are never batched; no train record is of interest
    predicts = {
        "loss": "ln(k) from the start of training to the end: a freshly initialised k-way head guesses "
                "uniformly and a model that learns nothing stays there (a log that begins after the start "
                "shows a plateau, not where it came from: an LM's loss starts near ln of its vocabulary and "
                "can level off anywhere, ln 10 = 2.30 included)",
        "eval_loss": "ln(k) from the first evaluation to the last",
        "eval_accuracy": "about 1/k",
        "grad_norm": "anything (a uniform head still gets gradients)",
        "lr": "anything",
    }
    demoted = Severity.WARNING  # a flat loss is still worth a look
    code = "LOSS010"
    name = "loss.at-chance"
    signature = "not-learning"
    severity = Severity.ERROR

    def __init__(self) -> None:
        super().__init__()
        # rank -> [k or None once an evaluation left it, evaluations, first step]
        self._evals: dict[int | None, list] = {}

    def observe(self, record: Record) -> list[Finding]:
        value = record.signals.get("eval_loss")
        if record.kind != EVAL or value is None:
            return []
        k = None if is_rl(record) else chance_classes(value)
        run = self._evals.setdefault(record.rank, [k, 0, record.step])
        if run[0] != k:
            run[0] = None  # left its band (or never was in one): not at chance from first to last
        run[1] += 1
        return []

    def finish(self) -> list[Finding]:
        super().finish()
        for rank, (k, count, since) in self._evals.items():
            if k is None or count < CHANCE_LOGS:
                continue
            if self._train_fell(rank):
                return self.emit(f"the evaluation loss stays at ln({k}) = {math.log(k):.4f} in all {count} "
                                 f"evaluations from step {since} while the training loss fell: the model fits its "
                                 f"training set and still guesses uniformly over {k} classes on the evaluation "
                                 "set", since, rank, severity=Severity.WARNING, classes=k)
            return self._report("evaluation loss", k, count, since, rank)
        for rank, profile in self.profile.items():
            if (k := _train_at_chance(profile)) is not None:
                return self._report("training loss", k, profile.num, profile.first_step, rank)
        return []

    def contradiction(self) -> str | None:
        firsts = [run[2] for run in self._evals.values()] + [p.first_step for _, p in self.profile.items()]
        first = min((step for step in firsts if step is not None), default=None)
        if first is None or first <= _FROM_START:
            return None
        return (f"the log begins at step {first}, after the start of training: a loss level reached from "
                "above is a plateau, and ln(k) means chance only for a k-way choice that sat there from its "
                "first step")

    def _report(self, what: str, k: int, count: int, since: int | None, rank: int | None) -> list[Finding]:
        return self.emit(f"the {what} stays at ln({k}) = {math.log(k):.4f} in all {count} logs from step {since}: "
                         f"the model predicts each of {k} classes with the same probability (chance), it is "
                         "not learning", since, rank, classes=k)

    def _train_fell(self, rank: int | None) -> bool:
        profile = self.profile.get(rank) or self.profile.get(None)
        if profile is None or profile.num < 2 * len(profile.tail) or not profile.head:
            return False
        head, tail = sum(profile.head) / len(profile.head), sum(profile.tail) / len(profile.tail)
        return tail < _FELL * head


def _train_at_chance(profile: RankProfile) -> int | None:
    """k when a rank's training loss began and ended at ln(k) and never went under that band."""
    if profile.num < CHANCE_LOGS:
        return None
    found = {chance_classes(value) for value in (*profile.head, *profile.tail)}
    if len(found) != 1 or (k := found.pop()) is None:
        return None
    return k if profile.minimum >= math.log(k) * (1 - TOLERANCE) else None
