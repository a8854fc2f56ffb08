"""Evaluation series against the training loss: overfitting.

A train loss that keeps falling while the evaluation loss climbs far above its best is the model fitting its
training set at the expense of what it should generalise to. The run is valid (the weights are fine), so this
is a warning that names the best evaluation and where to take the checkpoint from, never a death.
"""

from __future__ import annotations

import math

from lossguard.core.findings import Finding, Severity
from lossguard.core.records import EVAL, Record
from lossguard.detectors._base import DetectorBase
from lossguard.detectors.registry import register

# The evaluation loss must rise this far above its best (relative) ...
_RISE = 0.5
# ... on this many evaluations in a row after the best, so one noisy evaluation is not a trend.
_EVALS_ABOVE = 2


class _Best:
    __slots__ = ("value", "step", "train_at_best", "above", "worst")

    def __init__(self) -> None:
        self.value = math.inf
        self.step: int | None = None
        self.train_at_best: float | None = None
        self.above = 0
        self.worst = 0.0


@register
class Overfitting(DetectorBase):
    """EVAL001: the evaluation loss climbs far above its best (by half or more, on consecutive evaluations)
    while the training loss keeps falling: the model is overfitting. The weights are valid; the best
    checkpoint is the one nearest the best evaluation. Fix: stop at (or load) the best checkpoint
    (`load_best_model_at_end=True` with `metric_for_best_model="eval_loss"`), fewer epochs, more data,
    regularisation (dropout, weight decay), a lower learning rate."""

    # Train records are not routed here: the latest train loss comes from the engine's signal counts.
    wants = frozenset({"eval_loss"})
    spared_when: dict = {}  # evaluations are never batched; no train record is of interest
    code = "EVAL001"
    name = "eval.overfitting"
    signature = None
    severity = Severity.WARNING

    def __init__(self) -> None:
        super().__init__()
        self._best = _Best()
        self._train: float | None = None  # the latest training loss when the last evaluation came

    def observe(self, record: Record) -> list[Finding]:
        train = self.counts.last(record.rank, "loss")
        if train is None and record.rank is not None:
            train = self.counts.last(None, "loss")
        if train is not None and math.isfinite(train) and train > 0:
            self._train = train
        value = record.signals.get("eval_loss")
        if record.kind != EVAL or value is None or not math.isfinite(value):
            return []
        best = self._best
        if value < best.value:
            best.value, best.step, best.train_at_best, best.above = value, record.step, self._train, 0
            return []
        if value < best.value * (1 + _RISE) or not self._train_fell(best):
            best.above = 0
            return []
        best.above += 1
        best.worst = max(best.worst, value)
        if best.above < _EVALS_ABOVE:
            return []
        rise = best.worst / best.value - 1
        return self.emit(
            f"overfitting: the evaluation loss rose from its best {best.value:.4g} at step {best.step} to "
            f"{value:.4g} (+{rise:.0%}) while the training loss fell to {self._train:.3g}; the best weights are "
            f"those of step {best.step} (the checkpoint saved nearest it)", record.step, record.rank,
            best_step=best.step, best_eval_loss=best.value, eval_loss=value, train_loss=self._train)

    def _train_fell(self, best: _Best) -> bool:
        return self._train is not None and best.train_at_best is not None and self._train < best.train_at_best
