"""The loss profile: one per-rank summary of the training loss that every loss-trend detector reads.

The engine advances it once per train record, on both of its paths (`feed` and the batch path), with one
update loop (`LossProfile.advance`): count, baseline, minimum, head and tail, the run of repeated values,
the gradient norm's mean, the run of tiny losses, and a running average that leaves spikes out. Where a
record may concern a trend rule (it repeats the loss before it, it sits far above the run's start, a spike
came back down, a run of repeats, an earlier stretch of losses again), the loop hands the engine a `Reading` of the profile at that record; the engine routes
the record to the detectors that read that mark (`profile_mark`), which find the reading in
`LossProfile.reading`. Every other train record costs the trend detectors nothing, and no detector keeps
a copy of these statistics.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass

BASELINE_LOGS = 3
HEAD_LOGS = 5  # first and last logs a flat run is judged by
REPEAT_LOGS = 8  # logs at the same loss that make a run of repeats worth a look (LOSS004's streak)
SPIKE_RECOVER_WITHIN = 5
TINY = 0.01
TINY_RELATIVE = 0.02
_TINY_GRADS = 8
# A recurrence (LOSS009): this many losses in a row must come back, in order, with at least _RECUR_DISTINCT
# distinct values among them, so that a plateau printed at four decimals cannot produce one by chance.
RECUR_LOGS = 6
_RECUR_DISTINCT = 3
_RECUR_REMEMBER = 65536  # windows remembered per rank: memory stays bounded on a million-line log


@dataclass(frozen=True, slots=True)
class Reading:
    """The profile at one record, for the rules its marks concern."""

    seq: int  # this record's number among the rank's losses
    loss: float
    repeat: tuple[float, int, int | None]  # (value, run length, first step) of the run of equal losses
    reference: float | None  # the lowest start-of-run loss a divergence is judged against (None: none)
    high: bool  # far above the reference
    spike: tuple[int | None, float, float] | None  # (step, value, x average) of a spike that came back down
    recurs: int | None  # the last RECUR_LOGS losses repeat those that ended this many losses earlier


class RankProfile:
    __slots__ = ("num", "baseline_sum", "baseline", "minimum", "ema", "first_step", "head", "tail",
                 "grad_sum", "grad_num", "repeat_value", "repeat_streak", "repeat_since", "spike_at",
                 "spike_value", "spike_age", "tiny_since", "tiny_grads", "window", "windows", "nonzero")

    def __init__(self) -> None:
        self.num = 0
        self.baseline_sum, self.baseline = 0.0, None
        self.minimum = math.inf
        self.ema: float | None = None  # 0.8/0.2 running average; spikes and the logs while one is open left out
        self.first_step: int | None = None
        self.head: list[float] = []
        self.tail: collections.deque = collections.deque(maxlen=HEAD_LOGS)
        self.grad_sum, self.grad_num = 0.0, 0
        self.repeat_value: float | None = None
        self.repeat_streak, self.repeat_since = 0, None
        self.spike_at: int | None = None
        self.spike_value, self.spike_age = 0.0, 0
        self.tiny_since: int | None = None  # the run of logs under 2% of the first loss
        self.tiny_grads: set = set()
        self.window: tuple[float, ...] = ()  # the last RECUR_LOGS non-zero losses
        self.windows: dict[tuple[float, ...], int] = {}  # window -> its `nonzero` count where it ended
        self.nonzero = 0

    def add(self, loss: float, step: int | None, grad: float | None) -> Reading | None:
        """One finite loss; a Reading when some trend rule must look at this record."""
        self.num += 1
        if self.num <= BASELINE_LOGS:
            self.baseline_sum += loss
            if self.num == BASELINE_LOGS:
                self.baseline = self.baseline_sum / BASELINE_LOGS
        if self.first_step is None:
            self.first_step = step
        if len(self.head) < HEAD_LOGS:
            self.head.append(loss)
        self.tail.append(loss)
        grad_ok = grad is not None and math.isfinite(grad)
        if grad_ok:
            self.grad_sum += grad
            self.grad_num += 1
        self._repeat(loss, step)
        self._tiny(loss, step, grad if grad_ok else None)
        reference = min(self.minimum, self.baseline) if self.baseline else self.minimum
        valid = math.isfinite(reference) and reference > 0
        high = valid and loss > max(2.0 * reference, reference + 2.0)
        spike = self._spike(loss, step)
        recurs = self._recur(loss) if loss != 0.0 else None  # a zero loss is another rule's business
        if grad is None or grad_ok:  # beside a non-finite grad norm the logged loss is the NaN filter's stand-in
            self.minimum = min(self.minimum, loss)
        if high or spike is not None or recurs is not None or self.repeat_streak >= REPEAT_LOGS:
            return Reading(self.num, loss, (self.repeat_value, self.repeat_streak, self.repeat_since),
                           reference if valid else None, high, spike, recurs)
        return None

    def _recur(self, loss: float) -> int | None:
        """How many non-zero losses ago the last RECUR_LOGS of them (this one included) were seen before,
        value for value and in order; None when they are new (or too uniform to tell)."""
        self.nonzero += 1
        window = (self.window + (loss,))[-RECUR_LOGS:]
        self.window = window
        if len(window) < RECUR_LOGS or len(set(window)) < _RECUR_DISTINCT:
            return None
        earlier = self.windows.get(window)
        if earlier is None:
            if len(self.windows) < _RECUR_REMEMBER:
                self.windows[window] = self.nonzero
            return None
        return self.nonzero - earlier

    def _repeat(self, loss: float, step: int | None) -> None:
        """The run of logs at the same loss (within 0.01%). An exact 0.0 ends a run without starting one."""
        if loss == 0.0:
            self.repeat_streak = 0
        elif self.repeat_value is not None and math.isclose(loss, self.repeat_value, rel_tol=1e-4):
            self.repeat_streak += 1
        else:
            self.repeat_value, self.repeat_streak, self.repeat_since = loss, 1, step

    def _tiny(self, loss: float, step: int | None, grad: float | None) -> None:
        first = self.head[0]
        tiny = max(TINY, TINY_RELATIVE * first)  # relative to where the run started, never above 0.01
        if loss < tiny and first > 10 * TINY:
            if self.tiny_since is None:
                self.tiny_since = step
            if grad is not None and len(self.tiny_grads) < _TINY_GRADS:
                self.tiny_grads.add(grad)
        elif loss >= tiny:
            self.tiny_since, self.tiny_grads = None, set()

    def _spike(self, loss: float, step: int | None) -> tuple[int | None, float, float] | None:
        """The running average, with spikes kept out of it: a spike (3x the average and half a nat above
        it) opens a window of up to five logs that neither move the average nor open another spike; the
        window closes when the loss is back under 1.5x the average (a recovered spike, returned) or
        after five logs (not recovered: divergence's business)."""
        ema = self.ema
        if self.spike_at is not None:
            self.spike_age += 1
            if ema is not None and loss < 1.5 * ema:
                at, self.spike_at = self.spike_at, None
                return at, self.spike_value, self.spike_value / ema
            if self.spike_age > SPIKE_RECOVER_WITHIN:
                self.spike_at = None
            return None
        if self.num > BASELINE_LOGS and ema and loss > 3.0 * ema and loss > ema + 0.5:
            self.spike_at, self.spike_value, self.spike_age = step, loss, 0
            return None
        self.ema = loss if ema is None else 0.8 * ema + 0.2 * loss
        return None


class LossProfile:
    """Every rank's profile (None = the run-level log), in the order ranks first logged a loss."""

    __slots__ = ("_ranks", "reading")

    def __init__(self) -> None:
        self._ranks: dict[int | None, RankProfile] = {}
        self.reading: Reading | None = None  # the record being observed, set by the engine

    def get(self, rank: int | None) -> RankProfile | None:
        return self._ranks.get(rank)

    def items(self):
        return self._ranks.items()

    def advance(self, rank: int | None, columns: dict[str, list], steps: list, lo: int, hi: int) -> dict[int, Reading]:
        """Train records lo..hi-1 of a run (one rank) from its columns: index -> Reading where marked."""
        losses = columns.get("loss")
        raw = columns.get("raw_loss")
        if raw is not None:
            losses = [r if r is not None else v for r, v in zip(raw, losses or [None] * len(raw))]
        if losses is None:
            return {}
        grads = columns.get("grad_norm") or [None] * len(losses)
        profile = None
        marks: dict[int, Reading] = {}
        for index in range(lo, hi):
            loss = losses[index]
            if loss is None or not math.isfinite(loss):
                continue
            if profile is None:
                profile = self._ranks.get(rank) or self._ranks.setdefault(rank, RankProfile())
            if (reading := profile.add(loss, steps[index], grads[index])) is not None:
                marks[index] = reading
        return marks
