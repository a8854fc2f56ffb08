"""Loss trends over many logs: not learning, divergence, spikes that recover, benign memorisation.

Thresholds are relative to the run's own typical initial loss (KNOWLEDGE.md §2 G: loss levels are not
comparable across versions, GA settings and world sizes), never absolute. The statistics are the engine's
loss profile (core/profile.py), kept once for all of these rules: a rule reads the `Reading` of a record
the profile marked (`reads_profile`), or the profile itself at the end.
"""

from __future__ import annotations

from lossguard.core.findings import Finding, Severity
from lossguard.core.profile import REPEAT_LOGS, RankProfile, Reading
from lossguard.core.records import EVAL, TRAIN, Record
from lossguard.detectors._base import DetectorBase, Streak, is_nonfinite
from lossguard.detectors.registry import register

_FLAT_MIN_LOGS = 16
_FLAT_REL = 0.01  # the loss moved less than 1% between the first and the last logs
_FLAT_FROM_START = 100  # only judge logs that start at the beginning of training, not a plateau
_TINY_GRAD_PER_LOSS = 0.02


class _TrendDetector(DetectorBase):
    """A loss trend: `judge` decides on the reading of a record the profile marked."""

    wants = frozenset({"loss", "raw_loss"})
    calm: dict = {}  # no train record of its own interest: the profile marks the ones that matter
    reads_profile = True

    def observe(self, record: Record) -> list[Finding]:
        reading = self.profile.reading
        if record.kind != TRAIN or reading is None:
            return []
        return self.judge(record, reading)

    def judge(self, record: Record, reading: Reading) -> list[Finding]:
        return []


@register
class LossNotLearning(_TrendDetector):
    """LOSS004: the loss does not move: the same value log after log, or (over a whole run logged from
    its start) less than 1% between the first and the last logs. A flat run with a tiny gradient norm
    is LOSS008 (`no-grad-flow`) instead."""

    code = "LOSS004"
    name = "loss.flat"
    signature = "not-learning"
    severity = Severity.ERROR
    tiny_grad = False  # LOSS008 takes the flat runs whose gradient norm is tiny

    def judge(self, record: Record, reading: Reading) -> list[Finding]:
        value, streak, since = reading.repeat
        if streak < REPEAT_LOGS:
            return []
        return self.emit(f"loss stays at {reading.loss:g} for {streak} logs from step {since}: the model is "
                         "not learning", since, record.rank, value=reading.loss)

    def finish(self) -> list[Finding]:
        super().finish()
        for rank, flat in self.profile.items():
            found = _flat_from_start(flat)
            if found is None:
                continue
            start, end, grad = found
            if self.tiny_grad != (grad is not None and grad < _TINY_GRAD_PER_LOSS * start):
                continue
            return self.report(flat, rank, start, end, grad)
        return []

    def report(self, flat: RankProfile, rank: int | None, start: float, end: float, grad: float | None):
        return self.emit(
            f"the loss did not move in {flat.num} logs from the start ({start:.4g} -> {end:.4g}, under "
            f"{_FLAT_REL:.0%}): the weights are not being updated (learning rate, frozen parameters?)",
            flat.first_step, rank, start=start, end=end)


def _flat_from_start(flat: RankProfile) -> tuple[float, float, float | None] | None:
    """(first mean, last mean, mean grad norm) of a run logged from its start whose loss moved under
    1%, else None."""
    if flat.num < _FLAT_MIN_LOGS or flat.first_step is None or flat.first_step > _FLAT_FROM_START:
        return None
    start, end = sum(flat.head) / len(flat.head), sum(flat.tail) / len(flat.tail)
    if start < 0.05 or abs(end - start) > _FLAT_REL * start:
        return None
    return start, end, flat.grad_sum / flat.grad_num if flat.grad_num else None


@register
class LossFlatTinyGrad(LossNotLearning):
    """LOSS008: the loss did not move from the start of the run and the gradient norm is tiny (under 2%
    of the loss): almost nothing trainable receives a gradient (LoRA + reentrant checkpointing leaves
    only biases outside the blocks with one). Reported as `no-grad-flow`; LOSS004 then stays quiet."""

    code = "LOSS008"
    name = "loss.flat-tiny-grad"
    signature = "no-grad-flow"
    severity = Severity.CRITICAL
    tiny_grad = True
    reads_profile = False  # the repeat run is LOSS004's; this code judges only the whole run, at the end

    def judge(self, record: Record, reading: Reading) -> list[Finding]:
        return []

    def report(self, flat: RankProfile, rank: int | None, start: float, end: float, grad: float | None):
        return self.emit(
            f"the loss did not move in {flat.num} logs ({start:.4g} -> {end:.4g}) and the gradient norm "
            f"is tiny (mean {grad:.3g}): almost nothing trainable receives a gradient",
            flat.first_step, rank, start=start, end=end, mean_grad_norm=grad)


@register
class LossDivergence(_TrendDetector):
    """LOSS005: the loss climbs far above where it started (over twice the lowest of the first logs and
    the minimum so far, and 2 above it) and stays there."""

    code = "LOSS005"
    name = "loss.divergence"
    signature = "divergence"
    severity = Severity.CRITICAL
    _STREAK = 5

    def __init__(self) -> None:
        super().__init__()
        self._high: dict = {}  # rank -> Streak of high logs (in a row: consecutive profile seqs)

    def judge(self, record: Record, reading: Reading) -> list[Finding]:
        if not reading.high:
            return []
        high = self._high.setdefault(record.rank, Streak())
        if high.update(True, record.step, reading.seq) < self._STREAK:
            return []
        return self.emit(f"loss rose from about {reading.reference:.3g} to {reading.loss:.3g} and stayed above "
                         f"twice its start for {high.count} logs from step {high.since}", high.since,
                         record.rank, baseline=reading.reference, value=reading.loss)


@register
class LossSpike(_TrendDetector):
    """LOSS006: an isolated loss spike (3x the running average) that comes back down within five logs."""

    code = "LOSS006"
    name = "loss.spike"
    signature = "loss-spike"
    severity = Severity.WARNING

    def judge(self, record: Record, reading: Reading) -> list[Finding]:
        if reading.spike is None:
            return []
        at, value, ratio = reading.spike
        return self.emit(f"loss spiked to {value:.3g} at step {at} (about {ratio:.1f}x its running average) "
                         "and recovered", at, record.rank, value=value)


@register
class Memorization(DetectorBase):
    """LOSS007: the loss decayed smoothly to ~0 (under 2% of where it started; prints as 0.0 under
    `round(loss, 4)`) with finite, varying gradient norms: not a dead run. Informational. The eval loss
    tells the two kinds apart: high for memorisation (overfitting), low too for label leakage."""

    wants = frozenset({"eval_loss"})
    calm: dict = {}  # evaluations are never batched; the run of tiny losses is the profile's
    code = "LOSS007"
    name = "loss.memorization"
    signature = "memorization"
    severity = Severity.INFO

    def __init__(self) -> None:
        super().__init__()
        self._eval: dict = {}  # rank -> the latest eval loss once the rank had logged a loss

    def observe(self, record: Record) -> list[Finding]:
        if record.kind == EVAL and record.signals.get("eval_loss") is not None:
            for rank, _ in self.profile.items():
                self._eval[rank] = record.signals["eval_loss"]
        return []

    def finish(self) -> list[Finding]:
        for rank, state in self.profile.items():
            if state.tiny_since is None or len(state.tiny_grads) < 2:
                continue
            first, eval_loss = state.head[0], self._eval.get(rank)
            eval_note = ("" if eval_loss is None else
                         f"; eval_loss is {eval_loss:.3g}" + (" (NaN: check for a dead run)"
                                                              if is_nonfinite(eval_loss) else ""))
            data = {}
            if eval_loss is not None and not is_nonfinite(eval_loss):
                data["eval_ratio"] = eval_loss / first  # low: leakage; high: overfitting
            return self.emit(
                f"loss decayed smoothly from {first:.3g} to under 2% of it from step {state.tiny_since} with "
                f"finite, varying grad norms: the model fits its training data almost perfectly (not a dead "
                f"run){eval_note}", state.tiny_since, rank, **data)
        return []
