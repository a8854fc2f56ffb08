"""A loss sequence that repeats value for value: the weights never change.

With a fixed data order, a model whose weights do not move computes the same loss on the same batch every
epoch, so the logged sequence of one epoch comes back digit for digit in the next. A learning model cannot do
that: its losses on the same batches fall. This catches what a flat-line test misses, a loss that looks busy
(it goes up and down batch to batch) but is a recording of one epoch played again. The engine's loss
profile (core/profile.py) remembers the windows of losses and marks the record where one comes back.
"""

from __future__ import annotations

import math

from lossguard.core.findings import Finding, Severity
from lossguard.core.profile import RECUR_LOGS, TrendMark
from lossguard.core.records import EVAL, Record
from lossguard.detectors.registry import register
from lossguard.detectors.trends import TrendDetector

_EVAL_MOVED = 1e-3  # relative: two evaluations further apart than a print's rounding


@register
class LossRepeats(TrendDetector):
    """LOSS009: the logged loss repeats an earlier stretch of the run value for value (six or more logs in the
    same order): the same batches give the same loss, so the weights are not being updated (learning rate 0,
    frozen parameters, an optimizer that skips every step). Fix: check the learning rate schedule, which
    parameters require grad and are in the optimizer, and the skipped-step count.

    Checked against the evaluation loss: weights that never change give the same evaluation loss every time.
    Evaluations that change (by more than 0.1%) say the weights were updated, and the repeat is the log's (a
    run launched again with the same seed into the same file replays its first run value for value): info."""

    predicts = {
        "loss": "an earlier stretch again, value for value, epoch after epoch, and no trend over the run",
        "eval_loss": "the same value at every evaluation (evaluations that change contradict it: the weights "
                     "moved)",
        "grad_norm": "anything (the gradient is computed, never applied), or a repeating sequence too",
        "lr": "0, or anything when the parameters are frozen or every step is skipped",
        "skipped_steps": "growing by one every step when the optimizer skips them",
    }
    code = "LOSS009"
    name = "loss.repeats"
    signature = "not-learning"
    severity = Severity.ERROR
    wants = frozenset({*TrendDetector.wants, "eval_loss"})

    def __init__(self) -> None:
        super().__init__()
        self._evals: list[float] = []  # the first evaluation loss and the latest that differs from it

    def observe(self, record: Record) -> list[Finding]:
        value = record.signals.get("eval_loss")
        if record.kind == EVAL and value is not None and math.isfinite(value):
            if not self._evals:
                self._evals.append(value)
            elif abs(value - self._evals[0]) > _EVAL_MOVED * abs(self._evals[0]):
                self._evals[1:] = [value]
            return []
        return super().observe(record)

    def judge(self, record: Record, mark: TrendMark) -> list[Finding]:
        if mark.recurs is None:
            return []
        return self.emit(
            f"the loss repeats, value for value, the {RECUR_LOGS} logs that ended {mark.recurs} logs "
            f"earlier (last {mark.loss:g} at step {record.step}): the same batches give the same loss, so "
            "the weights are not being updated", record.step, record.rank, period_logs=mark.recurs)

    def contradiction(self) -> str | None:
        if len(self._evals) < 2:
            return None
        first, moved = self._evals
        return (f"the evaluation loss changed from {first:g} to {moved:g}: weights that are never updated give "
                "the same evaluation loss every time, so the repeat is the log's (a run launched again with the "
                "same seed replays its first run)")
