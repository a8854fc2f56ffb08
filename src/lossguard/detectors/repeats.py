"""A loss sequence that repeats value for value: the weights never change.

With a fixed data order, a model whose weights do not move computes the same loss on the same batch every
epoch, so the logged sequence of one epoch comes back digit for digit in the next. A learning model cannot do
that: its losses on the same batches fall. This catches what a flat-line test misses, a loss that looks busy
(it goes up and down batch to batch) but is a recording of one epoch played again.
"""

from __future__ import annotations

import math

from lossguard.core.findings import Finding, Severity
from lossguard.core.records import TRAIN, Record
from lossguard.detectors._base import DetectorBase, PerRank
from lossguard.detectors.registry import register

# Losses in a row that must recur, in order, to count as a repeat: long enough that a plateau printed at
# four decimals cannot produce it by chance, and the run must hold at least this many distinct values.
_RUN = 6
_DISTINCT = 3
# How many past windows are remembered (memory stays bounded on a million-line log).
_REMEMBER = 65536


class _History:
    __slots__ = ("window", "seen", "position")

    def __init__(self) -> None:
        self.window: tuple[float, ...] = ()
        self.seen: dict[tuple[float, ...], int] = {}  # window of _RUN losses -> position where it ended
        self.position = 0


@register
class LossRepeats(DetectorBase):
    """LOSS009: the logged loss repeats an earlier stretch of the run value for value (six or more logs in the
    same order): the same batches give the same loss, so the weights are not being updated (learning rate 0,
    frozen parameters, an optimizer that skips every step). Fix: check the learning rate schedule, which
    parameters require grad and are in the optimizer, and the skipped-step count."""

    wants = frozenset({"loss"})
    code = "LOSS009"
    name = "loss.repeats"
    signature = "not-learning"
    severity = Severity.ERROR

    def __init__(self) -> None:
        super().__init__()
        self._history = PerRank(_History)

    def observe(self, record: Record) -> list[Finding]:
        loss = record.signals.get("loss")
        if record.kind != TRAIN or loss is None or not math.isfinite(loss) or loss == 0.0:
            return []
        history = self._history[record.rank]
        history.position += 1
        window = (history.window + (loss,))[-_RUN:]
        history.window = window
        if len(window) < _RUN or len(set(window)) < _DISTINCT:
            return []
        earlier = history.seen.get(window)
        if earlier is None:
            if len(history.seen) < _REMEMBER:
                history.seen[window] = history.position
            return []
        return self.emit(
            f"the loss repeats, value for value, the {_RUN} logs that ended {history.position - earlier} logs "
            f"earlier (last {loss:g} at step {record.step}): the same batches give the same loss, so the weights "
            "are not being updated", record.step, record.rank, period_logs=history.position - earlier)
