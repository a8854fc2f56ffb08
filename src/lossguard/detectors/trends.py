"""Loss trends over many logs: not learning, divergence, spikes that recover, benign memorisation.

Thresholds are relative to the run's own typical initial loss (KNOWLEDGE.md §2 G: loss levels are not
comparable across versions, GA settings and world sizes), never absolute.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from lossguard.core.detector import register
from lossguard.core.findings import Finding, Severity
from lossguard.core.records import EVAL, TRAIN, Record
from lossguard.detectors._base import DetectorBase, PerRank, is_nonfinite

_BASELINE_LOGS = 3


@dataclass
class _Trend:
    num: int = 0
    baseline_sum: float = 0.0
    baseline: float | None = None
    ema: float | None = None
    minimum: float = math.inf
    repeat_value: float | None = None
    repeat_streak: int = 0
    repeat_since: int | None = None
    high_streak: int = 0
    high_since: int | None = None
    spike_at: int | None = None
    spike_value: float | None = None
    spike_age: int = 0
    first_values: list = field(default_factory=list)
    last: float | None = None


def _train_loss(record: Record) -> float | None:
    if record.kind != TRAIN:
        return None
    loss = record.get("raw_loss")
    if loss is None:
        loss = record.get("loss")
    return None if loss is None or is_nonfinite(loss) else loss


class _TrendDetector(DetectorBase):
    def __init__(self) -> None:
        super().__init__()
        self._state = PerRank(_Trend)

    def observe(self, record: Record) -> list[Finding]:
        loss = _train_loss(record)
        if loss is None:
            return []
        state = self._state[record.rank]
        state.num += 1
        if state.num <= _BASELINE_LOGS:
            state.baseline_sum += loss
            if state.num == _BASELINE_LOGS:
                state.baseline = state.baseline_sum / _BASELINE_LOGS
        found = self.check(record, loss, state)
        state.ema = loss if state.ema is None else 0.8 * state.ema + 0.2 * loss
        state.minimum = min(state.minimum, loss)
        state.last = loss
        return found

    def check(self, record: Record, loss: float, state: _Trend) -> list[Finding]:
        raise NotImplementedError


@register
class LossNotLearning(_TrendDetector):
    """LOSS004: the loss repeats the same value log after log: the weights are not being updated."""

    code = "LOSS004"
    name = "loss.flat"
    signature = "not-learning"
    severity = Severity.ERROR
    _STREAK = 8

    def check(self, record: Record, loss: float, state: _Trend) -> list[Finding]:
        if loss == 0.0:
            state.repeat_streak = 0
            return []
        if state.repeat_value is not None and math.isclose(loss, state.repeat_value, rel_tol=1e-4):
            state.repeat_streak += 1
        else:
            state.repeat_value, state.repeat_streak, state.repeat_since = loss, 1, record.step
        if state.repeat_streak >= self._STREAK:
            return self.emit(f"loss stays at {loss:g} for {state.repeat_streak} logs from step "
                             f"{state.repeat_since}: the model is not learning", state.repeat_since,
                             record.rank, value=loss)
        return []


@register
class LossDivergence(_TrendDetector):
    """LOSS005: the loss climbs far above where it started and stays there."""

    code = "LOSS005"
    name = "loss.divergence"
    signature = "divergence"
    severity = Severity.CRITICAL
    _STREAK = 5

    def check(self, record: Record, loss: float, state: _Trend) -> list[Finding]:
        if state.baseline is None or state.baseline <= 0:
            return []
        if loss > max(2.0 * state.baseline, state.baseline + 2.0):
            if state.high_streak == 0:
                state.high_since = record.step
            state.high_streak += 1
        else:
            state.high_streak = 0
        if state.high_streak >= self._STREAK:
            return self.emit(f"loss rose from about {state.baseline:.3g} to {loss:.3g} and stayed above "
                             f"twice its start for {state.high_streak} logs from step {state.high_since}",
                             state.high_since, record.rank, baseline=state.baseline, value=loss)
        return []


@register
class LossSpike(_TrendDetector):
    """LOSS006: an isolated loss spike (3x the running average) that comes back down."""

    code = "LOSS006"
    name = "loss.spike"
    signature = "loss-spike"
    severity = Severity.WARNING
    _RECOVER_WITHIN = 5

    def check(self, record: Record, loss: float, state: _Trend) -> list[Finding]:
        if state.spike_at is not None:
            state.spike_age += 1
            if state.ema is not None and loss < 1.5 * state.ema:
                at, value = state.spike_at, state.spike_value
                state.spike_at = None
                return self.emit(f"loss spiked to {value:.3g} at step {at} (about {value / state.ema:.1f}x "
                                 "its running average) and recovered", at, record.rank, value=value)
            if state.spike_age > self._RECOVER_WITHIN:
                state.spike_at = None  # did not recover: divergence's business
            return []
        if state.num > _BASELINE_LOGS and state.ema and loss > 3.0 * state.ema and loss > state.ema + 0.5:
            state.spike_at, state.spike_value, state.spike_age = record.step, loss, 0
            state.ema_at_spike = state.ema
        return []

    def observe(self, record: Record) -> list[Finding]:
        loss = _train_loss(record)
        if loss is None:
            return []
        state = self._state[record.rank]
        if state.spike_at is not None:  # keep the average from before the spike
            state.num += 1
            return self.check(record, loss, state)
        return super().observe(record)


@dataclass
class _Tiny:
    first: float | None = None
    tiny_since: int | None = None
    grads: set = field(default_factory=set)
    eval_loss: float | None = None


@register
class Memorization(DetectorBase):
    """LOSS007: the loss decayed smoothly to ~0 (prints as 0.0 under `round(loss, 4)`) with finite,
    varying gradient norms: memorisation of a small dataset, not a dead run. Informational."""

    code = "LOSS007"
    name = "loss.memorization"
    signature = "memorization"
    severity = Severity.INFO
    _TINY = 0.01

    def __init__(self) -> None:
        super().__init__()
        self._state = PerRank(_Tiny)

    def observe(self, record: Record) -> list[Finding]:
        if record.kind == EVAL and record.get("eval_loss") is not None:
            for _, state in self._state.items():
                state.eval_loss = record.get("eval_loss")
            return []
        loss = _train_loss(record)
        if loss is None:
            return []
        state = self._state[record.rank]
        if state.first is None:
            state.first = loss
        grad = record.get("grad_norm")
        if loss < self._TINY and state.first > 10 * self._TINY:
            if state.tiny_since is None:
                state.tiny_since = record.step
            if grad is not None and not is_nonfinite(grad) and len(state.grads) < 8:
                state.grads.add(grad)
        elif loss >= self._TINY:
            state.tiny_since, state.grads = None, set()
        return []

    def finish(self) -> list[Finding]:
        for rank, state in self._state.items():
            if state.tiny_since is not None and len(state.grads) >= 2:
                eval_note = ("" if state.eval_loss is None else
                             f"; eval_loss is {state.eval_loss:.3g}" + (" (NaN: check for a dead run)"
                                                                        if is_nonfinite(state.eval_loss) else ""))
                return self.emit(
                    f"loss decayed smoothly from {state.first:.3g} to below {self._TINY} from step "
                    f"{state.tiny_since} with finite, varying grad norms: the model memorised its training "
                    f"data (not a dead run){eval_note}", state.tiny_since, rank)
        return []
