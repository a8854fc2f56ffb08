"""Shared pieces for detectors: per-rank state, emit-once, and the value tests that decode a logged 0.0, NaN or sentinel."""

from __future__ import annotations

import bisect
import collections
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from lossguard.core.detector import Detector
from lossguard.core.findings import Finding, Severity

S = TypeVar("S")

# DeepSpeed replaces a non-finite per-group norm with -1 (or masks it), so the global norm becomes
# sqrt(number of groups): 1.0, 1.414..., 1.732..., 2.0: DeepSpeed ZeRO-1/2 logs sqrt(param groups) when every group's norm is non-finite (-1 each).
SENTINELS = tuple(math.sqrt(k) for k in range(1, 9))


# Signals only reinforcement-learning trainers log (TRL GRPO/PPO/DPO, ms-swift GRPO). Their loss is a policy
# objective, not a cross-entropy: GRPO's is beta * KL, which is legitimately 0.0 at the start. A zero loss in
# such a log says nothing about masked labels or a hidden NaN.
RL_SIGNALS = frozenset({"reward", "reward_std", "frac_reward_zero_std", "kl", "reward_margin", "reward_accuracy"})


def is_rl(record) -> bool:
    """The record comes from an RL trainer (it carries a reward or KL signal)."""
    return not RL_SIGNALS.isdisjoint(record.signals)


def is_nonfinite(value: float | None) -> bool:
    return value is not None and not math.isfinite(value)


# The widest `printed_tolerance` (a value printed with one decimal): a value farther than this from every
# sentinel is none, whatever its print.
_WIDEST = 0.05 + 2e-9


@functools.lru_cache(maxsize=4096)  # a grad norm printed to 4 decimals near a sentinel repeats: repr() once each
def printed_tolerance(value: float) -> float:
    """Half a unit in the last printed digit: transformers 5 prints '1.414', older versions the full float."""
    text = repr(float(value))
    if "e" in text or "inf" in text or "nan" in text:
        return 1e-6
    digits = text.replace("-", "").replace(".", "").lstrip("0")
    if len(digits) >= 9:  # a full float32/float64 repr
        return 1e-6
    decimals = len(text.split(".")[1]) if "." in text else 0
    return 0.5 * 10 ** (-decimals) + 1e-9


def sentinel_index(value: float | None) -> int | None:
    """k when `value` is sqrt(k) for a small integer k (to the precision it was printed with)."""
    if value is None or not 0 < value < 3.0:  # NaN compares False; a huge norm must not overflow v*v
        return None
    k = round(value * value)
    if not 1 <= k <= len(SENTINELS):
        return None
    # The only root a value can be within _WIDEST of: roots lie more than 0.18 apart, and within 0.05 of
    # sqrt(j) the square rounds to j.
    distance = abs(value - SENTINELS[k - 1])
    if distance > _WIDEST:
        return None  # cheap exit for the common case; the exact tolerance needs repr()
    return k if distance <= printed_tolerance(value) else None


# Each sentinel's neighbourhood as [low, high) edges: a value is near one when bisect lands on an odd
# index. `sentinel_index`'s own cheap exit allows _WIDEST either side.
_NEAR_SENTINEL = tuple(edge for root in SENTINELS for edge in (root - 1.01 * _WIDEST, root + 1.01 * _WIDEST))


def any_sentinel(values: list[float]) -> bool:
    """Some value is a sentinel. A C-speed range test first: most grad norms are nowhere near one."""
    return any(sentinel_index(v) for v in values if bisect.bisect(_NEAR_SENTINEL, v) & 1)


def no_sentinel(column: list) -> bool:
    """A column test for `spared_when` (core/column_tests.py): no value of the column (None allowed) is a
    sentinel."""
    return not any_sentinel([v for v in column if v is not None])


@dataclass(slots=True)
class Streak:
    """How many records in a row a condition has held, and the step where the run of them began. "In a
    row" is over the records the detector observes: one that keeps a streak must not be spared a record
    that could end it while the run is open (core/detector.py `spared_when_changes`; `Streaks.open`)."""

    count: int = 0
    since: int | None = None

    def update(self, holds: bool, step: int | None) -> int:
        if not holds:
            self.count = 0
        else:
            if self.count == 0:
                self.since = step
            self.count += 1
        return self.count


class Streaks:
    """A Streak per rank (None = the run-level log), and the ranks whose run is open: while any is, the
    detector spares no record that could end it."""

    __slots__ = ("_runs", "open")

    def __init__(self) -> None:
        self._runs: dict[int | None, Streak] = {}
        self.open: set[int | None] = set()

    def update(self, rank: int | None, holds: bool, step: int | None) -> Streak:
        run = self._runs.get(rank)
        if run is None:
            run = self._runs[rank] = Streak()
        if run.update(holds, step):
            self.open.add(rank)
        else:
            self.open.discard(rank)
        return run

    def end(self, rank: int | None) -> None:
        """A record that does not continue the rank's run (whatever its condition) ends it."""
        if rank in self.open:
            self.update(rank, False, None)

    def items(self):
        return self._runs.items()


class PerRank(Generic[S]):
    """State per rank (None = the run-level log), created on first use."""

    def __init__(self, factory: Callable[[], S]) -> None:
        self._factory = factory
        self._states: dict[int | None, S] = {}

    def __getitem__(self, rank: int | None) -> S:
        state = self._states.get(rank)
        if state is None:
            state = self._states[rank] = self._factory()
        return state

    def peek(self, rank: int | None) -> S | None:
        """The rank's state if it has one, without creating it."""
        return self._states.get(rank)

    def put(self, rank: int | None, state: S) -> None:
        self._states[rank] = state

    def items(self):
        return self._states.items()


class LossRun:
    """The first and last HEAD losses of a run of logs (O(1) per log): enough to tell a loss that falls
    through the run from one that only wanders around a level."""

    HEAD = 5
    __slots__ = ("num", "head", "tail")

    def __init__(self) -> None:
        self.num = 0
        self.head: list[float] = []
        self.tail: collections.deque = collections.deque(maxlen=self.HEAD)

    def add(self, loss: float | None) -> None:
        if loss is None or not math.isfinite(loss):
            return
        self.num += 1
        if len(self.head) < self.HEAD:
            self.head.append(loss)
        self.tail.append(loss)

    def fell(self) -> tuple[float, float] | None:
        """(first mean, last mean) when the loss fell through the run: six logs or more, the last ones
        (up to HEAD, at most half the run) averaging under 90% of as many first ones and under the lowest
        of them (batch noise around a level does neither), else None."""
        if self.num < 6:
            return None
        size = min(self.HEAD, self.num // 2)
        head, tail = self.head[:size], list(self.tail)[-size:]
        first, last = sum(head) / size, sum(tail) / size
        return (first, last) if last < 0.9 * first and last < min(head) else None

    def moved(self) -> bool:
        """Not one value (to 0.1%) throughout: the loss a frozen model gives on one repeated batch."""
        values = [*self.head, *self.tail]
        return bool(values) and max(values) - min(values) > 1e-3 * max(abs(v) for v in values)


class DetectorBase(Detector):
    """Emits one finding at the onset (the first time its condition holds), then counts. A finding that
    can call the run broken is checked against the other columns at the end (`review`): the detector's
    `predicts` table says what its mechanism predicts in each column, and `contradiction` returns what a
    column the log shows does against it; then the finding drops to `demoted` and says why."""

    severity = Severity.ERROR
    demoted = Severity.INFO  # a contradicted finding: the symptom is real, the death it stood for is not

    def __init__(self) -> None:
        super().__init__()
        self.fired: Finding | None = None
        self.count = 0

    def emit(self, message: str, step: int | None, rank: int | None = None, *,
             severity: Severity | None = None, signature: str | None = None, **data) -> list[Finding]:
        if self.fired is not None:
            return self.again()
        self.count += 1
        self.fired = Finding(code=self.code, name=self.name, severity=severity or self.severity,
                             message=message, step=step, rank=rank,
                             signature=signature or self.signature, data=data)
        return [self.fired]

    def again(self) -> list[Finding]:
        """`emit` once the detector has fired: one more occurrence, no new finding. A detector that fires on
        every record of a dead run calls it before building a message `emit` would drop."""
        self.count += 1
        return []

    def finish(self) -> list[Finding]:
        if self.fired is not None and self.count > 1:
            self.fired.data["occurrences"] = self.count
        return []

    def review(self) -> None:
        fired = self.fired
        if fired is None or fired.severity < Severity.ERROR or (why := self.contradiction()) is None:
            return
        fired.severity = self.demoted
        fired.data["contradicted"] = why
        fired.message += f"; but {why}, so it is not a dead run"
