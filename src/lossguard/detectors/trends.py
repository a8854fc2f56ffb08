"""Loss trends over many logs: not learning, divergence, spikes that recover, benign memorisation.

Thresholds are relative to the run's own typical initial loss (KNOWLEDGE.md §2 G: loss levels are not
comparable across versions, GA settings and world sizes), never absolute.
"""

from __future__ import annotations

import collections
import copy
import math
from dataclasses import dataclass, field

from lossguard.core.batch import Batch
from lossguard.core.findings import Finding, Severity
from lossguard.core.records import EVAL, TRAIN, Record
from lossguard.detectors._base import DetectorBase, PerRank, Streak, is_nonfinite
from lossguard.detectors.registry import register

_BASELINE_LOGS = 3

# What a trend check asks `emit` for: (message, step, rank, data).
Alarm = tuple[str, "int | None", "int | None", dict]


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
    high: Streak = field(default_factory=Streak)
    spike_at: int | None = None
    spike_value: float | None = None
    spike_age: int = 0

    def clone(self) -> _Trend:
        twin = copy.copy(self)
        twin.high = Streak(self.high.count, self.high.since)
        return twin


def _next_ema(ema: float, loss: float) -> float:
    """The running average after one more log; every path folds it with this, so they agree to the bit."""
    return 0.8 * ema + 0.2 * loss


def _train_loss(record: Record) -> float | None:
    if record.kind != TRAIN:
        return None
    loss = record.signals.get("raw_loss")
    if loss is None:
        loss = record.signals.get("loss")
    return None if loss is None or is_nonfinite(loss) else loss


class _TrendDetector(DetectorBase):
    """A loss trend per rank. `check` decides on one log and returns an `Alarm` (or None) without
    emitting, so that `absorb` can run it on a copy of the state and hand a batch with any alarm back to
    `observe`."""

    state_class: type[_Trend] = _Trend

    def __init__(self) -> None:
        super().__init__()
        self._state = PerRank(self.state_class)

    def observe(self, record: Record) -> list[Finding]:
        loss = _train_loss(record)
        if loss is None:
            return []
        alarm = self._step(record, loss, self._state[record.rank])
        return [] if alarm is None else self._emit_alarm(alarm)

    def absorb(self, batch: Batch) -> bool:
        losses = batch.train_losses()
        if not losses:
            return True
        current = self._state.peek(batch.rank)
        if current is not None and current.num >= _BASELINE_LOGS and self.settled(current) and \
                self.absorb_quietly(current, batch):
            return True
        # Near the start (the baseline is forming) or when the fast check is unsure: the same `_step`
        # as `observe`, on a copy of the state.
        state = current.clone() if current is not None else self.state_class()
        if not self.settled(state):
            return False
        for record, loss in losses:
            if self._step(record, loss, state) is not None or not self.settled(state):
                return False
        self._state.put(batch.rank, state)
        return True

    def _step(self, record: Record, loss: float, state: _Trend) -> Alarm | None:
        state.num += 1
        if state.num <= _BASELINE_LOGS:
            state.baseline_sum += loss
            if state.num == _BASELINE_LOGS:
                state.baseline = state.baseline_sum / _BASELINE_LOGS
        alarm = self.check(record, loss, state)
        state.ema = loss if state.ema is None else _next_ema(state.ema, loss)
        state.minimum = min(state.minimum, loss)
        return alarm

    def absorb_quietly(self, state: _Trend, batch: Batch) -> bool:
        """The fast path once the baseline is set: prove from the batch as a whole that `check` stays
        quiet, then update the state in bulk; False (state untouched) when it cannot."""
        return False

    @staticmethod
    def _advance(state: _Trend, values: list[float]) -> None:
        """`_step`'s updates for many logs at once (baseline already set). The EMA is folded in the
        same order with the same arithmetic as one by one, so it is bit-identical."""
        ema = state.ema
        for value in values:
            ema = _next_ema(ema, value)
        state.num += len(values)
        state.ema = ema
        state.minimum = min(state.minimum, min(values))

    def _emit_alarm(self, alarm: Alarm) -> list[Finding]:
        message, step, rank, data = alarm
        return self.emit(message, step, rank, **data)

    def check(self, record: Record, loss: float, state: _Trend) -> Alarm | None:
        raise NotImplementedError

    def settled(self, state: _Trend) -> bool:
        """False while the state holds something `absorb` must not carry (an open spike)."""
        return True


_FLAT_WINDOW = 5
_FLAT_MIN_LOGS = 16
_FLAT_REL = 0.01  # the loss moved less than 1% between the first and the last logs
_FLAT_FROM_START = 100  # only judge logs that start at the beginning of training, not a plateau
_TINY_GRAD_PER_LOSS = 0.02


@dataclass
class _FlatTrend(_Trend):
    first_step: int | None = None
    head: list = field(default_factory=list)
    tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=_FLAT_WINDOW))
    grad_sum: float = 0.0
    grad_num: int = 0

    def clone(self) -> _FlatTrend:
        twin = super().clone()
        twin.head, twin.tail = list(self.head), collections.deque(self.tail, maxlen=_FLAT_WINDOW)
        return twin


def _repeat(value: float | None, streak: int, since: int | None, loss: float,
            step: int | None) -> tuple[float | None, int, int | None]:
    """The run of logs at the same loss (within 0.01%): (its value, its length, its first step) after
    `loss`. An exact 0.0 ends a run without starting one: zeros are other detectors' business."""
    if loss == 0.0:
        return value, 0, since
    if value is not None and math.isclose(loss, value, rel_tol=1e-4):
        return value, streak + 1, since
    return loss, 1, step


@register
class LossNotLearning(_TrendDetector):
    """LOSS004: the loss does not move: the same value log after log, or (over a whole run logged from
    its start) less than 1% between the first and the last logs. A flat run with a tiny gradient norm
    is LOSS008 (`no-grad-flow`) instead."""

    wants = frozenset({"loss", "raw_loss"})
    code = "LOSS004"
    name = "loss.flat"
    signature = "not-learning"
    severity = Severity.ERROR
    state_class = _FlatTrend
    tiny_grad = False  # LOSS008 takes the flat runs whose gradient norm is tiny
    _STREAK = 8

    def check(self, record: Record, loss: float, state: _FlatTrend) -> Alarm | None:
        if state.first_step is None:
            state.first_step = record.step
        if len(state.head) < _FLAT_WINDOW:
            state.head.append(loss)
        state.tail.append(loss)
        grad = record.signals.get("grad_norm")
        if grad is not None and not is_nonfinite(grad):
            state.grad_sum += grad
            state.grad_num += 1
        state.repeat_value, state.repeat_streak, state.repeat_since = _repeat(
            state.repeat_value, state.repeat_streak, state.repeat_since, loss, record.step)
        if state.repeat_streak >= self._STREAK:
            return (f"loss stays at {loss:g} for {state.repeat_streak} logs from step "
                    f"{state.repeat_since}: the model is not learning", state.repeat_since, record.rank,
                    {"value": loss})
        return None

    def absorb_quietly(self, state: _FlatTrend, batch: Batch) -> bool:
        losses = batch.train_losses()
        value, streak, since = state.repeat_value, state.repeat_streak, state.repeat_since
        for record, loss in losses:  # `check`'s repeat run, on locals
            value, streak, since = _repeat(value, streak, since, loss, record.step)
            if streak >= self._STREAK:
                return False
        values = batch.train_loss_values()
        state.repeat_value, state.repeat_streak, state.repeat_since = value, streak, since
        state.head.extend(values[: _FLAT_WINDOW - len(state.head)])
        state.tail.extend(values)
        grad_sum, grad_num = state.grad_sum, state.grad_num
        for record, _ in losses:
            grad = record.signals.get("grad_norm")
            if grad is not None and not is_nonfinite(grad):
                grad_sum += grad
                grad_num += 1
        state.grad_sum, state.grad_num = grad_sum, grad_num
        self._advance(state, values)
        return True

    def finish(self) -> list[Finding]:
        super().finish()
        for rank, flat in self._state.items():
            found = _flat_from_start(flat)
            if found is None:
                continue
            start, end, grad = found
            if self.tiny_grad != (grad is not None and grad < _TINY_GRAD_PER_LOSS * start):
                continue
            return self.report(flat, rank, start, end, grad)
        return []

    def report(self, flat: _FlatTrend, rank: int | None, start: float, end: float, grad: float | None):
        return self.emit(
            f"the loss did not move in {flat.num} logs from the start ({start:.4g} -> {end:.4g}, under "
            f"{_FLAT_REL:.0%}): the weights are not being updated (learning rate, frozen parameters?)",
            flat.first_step, rank, start=start, end=end)


def _flat_from_start(flat: _FlatTrend) -> tuple[float, float, float | None] | None:
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

    def check(self, record: Record, loss: float, state: _FlatTrend) -> Alarm | None:
        super().check(record, loss, state)
        return None  # the repeat run is LOSS004's; this code judges only the whole run, at the end

    def report(self, flat: _FlatTrend, rank: int | None, start: float, end: float, grad: float | None):
        return self.emit(
            f"the loss did not move in {flat.num} logs ({start:.4g} -> {end:.4g}) and the gradient norm "
            f"is tiny (mean {grad:.3g}): almost nothing trainable receives a gradient",
            flat.first_step, rank, start=start, end=end, mean_grad_norm=grad)


@register
class LossDivergence(_TrendDetector):
    """LOSS005: the loss climbs far above where it started and stays there."""

    wants = frozenset({"loss", "raw_loss"})
    code = "LOSS005"
    name = "loss.divergence"
    signature = "divergence"
    severity = Severity.CRITICAL
    _STREAK = 5

    def check(self, record: Record, loss: float, state: _Trend) -> Alarm | None:
        # The reference is the lowest loss so far among the first logs: a run that blows up at its
        # second step must not take the blown-up value as its baseline.
        reference = min(state.minimum, state.baseline) if state.baseline else state.minimum
        if not math.isfinite(reference) or reference <= 0:
            return None
        high = state.high
        if high.update(loss > max(2.0 * reference, reference + 2.0), record.step) >= self._STREAK:
            return (f"loss rose from about {reference:.3g} to {loss:.3g} and stayed above twice its start "
                    f"for {high.count} logs from step {high.since}", high.since, record.rank,
                    {"baseline": reference, "value": loss})
        return None

    def absorb_quietly(self, state: _Trend, batch: Batch) -> bool:
        # The reference only falls as the minimum does, and the bar rises with it: if the highest loss
        # stays under the bar of the lowest possible reference, no log of the batch is high.
        values = batch.train_loss_values()
        lowest = min(state.minimum, min(values))
        if state.baseline:
            lowest = min(lowest, state.baseline)
        if not (0.0 < lowest < math.inf) or max(values) > max(2.0 * lowest, lowest + 2.0):
            return False
        state.high.count = 0
        self._advance(state, values)
        return True


def _spikes(loss: float, ema: float | None) -> bool:
    """3x the running average, and half a nat above it (a tiny loss tripling is not a spike)."""
    return bool(ema) and loss > 3.0 * ema and loss > ema + 0.5


@register
class LossSpike(_TrendDetector):
    """LOSS006: an isolated loss spike (3x the running average) that comes back down."""

    wants = frozenset({"loss", "raw_loss"})
    code = "LOSS006"
    name = "loss.spike"
    signature = "loss-spike"
    severity = Severity.WARNING
    _RECOVER_WITHIN = 5

    def check(self, record: Record, loss: float, state: _Trend) -> Alarm | None:
        if state.spike_at is not None:
            state.spike_age += 1
            if state.ema is not None and loss < 1.5 * state.ema:
                at, value = state.spike_at, state.spike_value
                state.spike_at = None
                return (f"loss spiked to {value:.3g} at step {at} (about {value / state.ema:.1f}x its running "
                        "average) and recovered", at, record.rank, {"value": value})
            if state.spike_age > self._RECOVER_WITHIN:
                state.spike_at = None  # did not recover: divergence's business
            return None
        if state.num > _BASELINE_LOGS and _spikes(loss, state.ema):
            state.spike_at, state.spike_value, state.spike_age = record.step, loss, 0
        return None

    def settled(self, state: _Trend) -> bool:
        return state.spike_at is None

    def absorb_quietly(self, state: _Trend, batch: Batch) -> bool:
        values = batch.train_loss_values()
        ema = state.ema
        for value in values:  # `check`'s spike test (the baseline is set) against the EMA at each log
            if _spikes(value, ema):
                return False
            ema = _next_ema(ema, value)
        self._advance(state, values)
        return True

    def observe(self, record: Record) -> list[Finding]:
        loss = _train_loss(record)
        if loss is None:
            return []
        state = self._state[record.rank]
        if state.spike_at is not None:  # while a spike is open, the average stays the one from before
            state.num += 1
            alarm = self.check(record, loss, state)
            return [] if alarm is None else self._emit_alarm(alarm)
        before = state.ema
        found = super().observe(record)
        if state.spike_at is not None:
            state.ema = before  # the spike itself must not raise the bar its recovery is judged by
        return found


@dataclass
class _Tiny:
    first: float | None = None
    tiny_since: int | None = None
    grads: set = field(default_factory=set)
    eval_loss: float | None = None


@register
class Memorization(DetectorBase):
    """LOSS007: the loss decayed smoothly to ~0 (under 2% of where it started; prints as 0.0 under
    `round(loss, 4)`) with finite, varying gradient norms: not a dead run. Informational. The eval loss
    tells the two kinds apart: high for memorisation (overfitting), low too for label leakage."""

    wants = frozenset({"loss", "raw_loss", "eval_loss"})
    code = "LOSS007"
    name = "loss.memorization"
    signature = "memorization"
    severity = Severity.INFO
    _TINY = 0.01
    _TINY_RELATIVE = 0.02

    def __init__(self) -> None:
        super().__init__()
        self._state = PerRank(_Tiny)

    def observe(self, record: Record) -> list[Finding]:
        if record.kind == EVAL and record.signals.get("eval_loss") is not None:
            for _, state in self._state.items():
                state.eval_loss = record.signals.get("eval_loss")
            return []
        loss = _train_loss(record)
        if loss is not None:
            self._track(self._state[record.rank], record, loss)
        return []

    def absorb(self, batch: Batch) -> bool:
        # `observe` never reports from a train log (only `finish` does): track every one, exactly.
        losses = batch.train_losses()
        if not losses:
            return True
        state = self._state[batch.rank]
        if state.first is not None and \
                min(batch.train_loss_values()) >= max(self._TINY, self._TINY_RELATIVE * state.first):
            state.tiny_since, state.grads = None, set()  # what `_track` leaves after any loss not tiny
            return True
        for record, loss in losses:
            self._track(state, record, loss)
        return True

    def _track(self, state: _Tiny, record: Record, loss: float) -> None:
        if state.first is None:
            state.first = loss
        # "Tiny" is relative to where the run started (2%), never above an absolute 0.01 floor.
        tiny = max(self._TINY, self._TINY_RELATIVE * state.first)
        if loss < tiny and state.first > 10 * self._TINY:
            if state.tiny_since is None:
                state.tiny_since = record.step
            grad = record.signals.get("grad_norm")
            if grad is not None and not is_nonfinite(grad) and len(state.grads) < 8:
                state.grads.add(grad)
        elif loss >= tiny:
            state.tiny_since, state.grads = None, set()

    def finish(self) -> list[Finding]:
        for rank, state in self._state.items():
            if state.tiny_since is not None and len(state.grads) >= 2:
                eval_note = ("" if state.eval_loss is None else
                             f"; eval_loss is {state.eval_loss:.3g}" + (" (NaN: check for a dead run)"
                                                                        if is_nonfinite(state.eval_loss) else ""))
                data = {}
                if state.eval_loss is not None and not is_nonfinite(state.eval_loss):
                    data["eval_ratio"] = state.eval_loss / state.first  # low: leakage; high: overfitting
                return self.emit(
                    f"loss decayed smoothly from {state.first:.3g} to under 2% of it from step "
                    f"{state.tiny_since} with finite, varying grad norms: the model fits its training data "
                    f"almost perfectly (not a dead run){eval_note}", state.tiny_since, rank, **data)
        return []
