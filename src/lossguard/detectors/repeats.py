"""A loss sequence that repeats value for value: the weights never change.

With a fixed data order, a model whose weights do not move computes the same loss on the same batch every
epoch, so the logged sequence of one epoch comes back digit for digit in the next. A learning model cannot do
that: its losses on the same batches fall. This catches what a flat-line test misses, a loss that looks busy
(it goes up and down batch to batch) but is a recording of one epoch played again. The engine's loss
profile (core/profile.py) remembers the windows of losses and marks the record where one comes back.
"""

from __future__ import annotations

from lossguard.core.findings import Finding, Severity
from lossguard.core.profile import RECUR_LOGS, TrendMark
from lossguard.core.records import Record
from lossguard.detectors.registry import register
from lossguard.detectors.trends import TrendDetector


@register
class LossRepeats(TrendDetector):
    """LOSS009: the logged loss repeats an earlier stretch of the run value for value (six or more logs in the
    same order): the same batches give the same loss, so the weights are not being updated (learning rate 0,
    frozen parameters, an optimizer that skips every step). Fix: check the learning rate schedule, which
    parameters require grad and are in the optimizer, and the skipped-step count."""

    code = "LOSS009"
    name = "loss.repeats"
    signature = "not-learning"
    severity = Severity.ERROR

    def judge(self, record: Record, mark: TrendMark) -> list[Finding]:
        if mark.recurs is None:
            return []
        return self.emit(
            f"the loss repeats, value for value, the {RECUR_LOGS} logs that ended {mark.recurs} logs "
            f"earlier (last {mark.loss:g} at step {record.step}): the same batches give the same loss, so "
            "the weights are not being updated", record.step, record.rank, period_logs=mark.recurs)
