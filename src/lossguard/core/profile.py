"""The loss profile: one per-rank summary of the training loss that every loss-trend detector reads.

The engine advances it once per train record, on both of its paths (`feed` and the batch path), with one
update loop (`RankProfile.run`, through `LossProfile.advance`): count, baseline, minimum, head and tail, the run of repeated values,
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

    def run(self, losses: list, steps: list, grads: list, lo: int, hi: int) -> dict[int, Reading]:
        """Records lo..hi-1 of a run, in order (a loss that is None or not finite is no loss here): index ->
        Reading where some trend rule must look. One loop with the state in local variables: it runs once
        per train record of a big log, and a method call per statistic cost more than the statistics."""
        num, baseline_sum, baseline, minimum = self.num, self.baseline_sum, self.baseline, self.minimum
        ema, first_step, head, tail = self.ema, self.first_step, self.head, self.tail
        grad_sum, grad_num = self.grad_sum, self.grad_num
        repeat_value, repeat_streak, repeat_since = self.repeat_value, self.repeat_streak, self.repeat_since
        spike_at, spike_value, spike_age = self.spike_at, self.spike_value, self.spike_age
        tiny_since, tiny_grads = self.tiny_since, self.tiny_grads
        window, windows, nonzero = self.window, self.windows, self.nonzero
        # The window as RECUR_LOGS (six) slots, None where no loss came yet, its last five in locals: each new
        # window is one tuple built, not a concatenation and a slice.
        filled = len(window)
        window = (None,) * (RECUR_LOGS - filled) + window
        _, w1, w2, w3, w4, w5 = window
        isfinite, isclose = math.isfinite, math.isclose
        # Comparisons in place of min() / max() below: a builtin call costs as much as the rest of a statistic.
        tiny = _tiny_under(head[0]) if head else None
        head_open = len(head) < HEAD_LOGS
        big_start = bool(head) and head[0] > 10 * TINY  # the first loss is far above what counts as tiny
        marks: dict[int, Reading] = {}
        for index in range(lo, hi):
            loss = losses[index]
            if loss is None or not isfinite(loss):
                continue
            step, grad = steps[index], grads[index]
            num += 1
            if num <= BASELINE_LOGS:
                baseline_sum += loss
                if num == BASELINE_LOGS:
                    baseline = baseline_sum / BASELINE_LOGS
            if first_step is None:
                first_step = step
            if head_open:
                head.append(loss)
                head_open = len(head) < HEAD_LOGS
                if tiny is None:
                    tiny = _tiny_under(loss)
                    big_start = loss > 10 * TINY
            tail.append(loss)
            grad_ok = grad is not None and isfinite(grad)
            if grad_ok:
                grad_sum += grad
                grad_num += 1
            # The run of logs at the same loss (within 0.01%). An exact 0.0 ends a run without starting one.
            if loss == 0.0:
                repeat_streak = 0
            elif repeat_value is not None and isclose(loss, repeat_value, rel_tol=1e-4):
                repeat_streak += 1
            else:
                repeat_value, repeat_streak, repeat_since = loss, 1, step
            # The run of logs under 2% of the first loss (never above 0.01), with its first few grad norms.
            if loss < tiny and big_start:
                if tiny_since is None:
                    tiny_since = step
                if grad_ok and len(tiny_grads) < _TINY_GRADS:
                    tiny_grads.add(grad)
            elif loss >= tiny and (tiny_since is not None or tiny_grads):  # a run is open: it ends
                tiny_since, tiny_grads = None, set()
            reference = baseline if baseline and baseline < minimum else minimum
            valid = isfinite(reference) and reference > 0
            high = valid and loss > 2.0 * reference and loss > reference + 2.0
            # The running average, with spikes kept out of it: a spike (3x the average and half a nat above
            # it) opens a window of up to five logs that neither move the average nor open another spike; the
            # window closes when the loss is back under 1.5x the average (a recovered spike, marked) or after
            # five logs (not recovered: divergence's business).
            spike = None
            if spike_at is not None:
                spike_age += 1
                if ema is not None and loss < 1.5 * ema:
                    spike, spike_at = (spike_at, spike_value, spike_value / ema), None
                elif spike_age > SPIKE_RECOVER_WITHIN:
                    spike_at = None
            elif num > BASELINE_LOGS and ema and loss > 3.0 * ema and loss > ema + 0.5:
                spike_at, spike_value, spike_age = step, loss, 0
            else:
                ema = loss if ema is None else 0.8 * ema + 0.2 * loss
            # How many non-zero losses ago the last RECUR_LOGS of them (this one included) were seen before,
            # value for value and in order; None when they are new or too uniform to tell. A zero loss is
            # another rule's business.
            recurs = None
            if loss != 0.0:
                nonzero += 1
                window = (w1, w2, w3, w4, w5, loss)
                if filled < RECUR_LOGS:
                    filled += 1
                # At least _RECUR_DISTINCT different values (three different first values settle it cheaply).
                distinct = (w1 != w2 and w2 != w3 and w1 != w3) or len(set(window)) >= _RECUR_DISTINCT
                if filled == RECUR_LOGS and distinct:
                    if len(windows) < _RECUR_REMEMBER:  # the first time a window was seen is what counts
                        earlier = windows.setdefault(window, nonzero)
                        if earlier != nonzero:
                            recurs = nonzero - earlier
                    elif (earlier := windows.get(window)) is not None:
                        recurs = nonzero - earlier
                w1, w2, w3, w4, w5 = w2, w3, w4, w5, loss
            # Beside a non-finite grad norm the logged loss is the NaN filter's stand-in: no new minimum.
            if (grad is None or grad_ok) and loss < minimum:
                minimum = loss
            if high or spike is not None or recurs is not None or repeat_streak >= REPEAT_LOGS:
                marks[index] = Reading(num, loss, (repeat_value, repeat_streak, repeat_since),
                                       reference if valid else None, high, spike, recurs)
        self.num, self.baseline_sum, self.baseline, self.minimum = num, baseline_sum, baseline, minimum
        self.ema, self.first_step = ema, first_step
        self.grad_sum, self.grad_num = grad_sum, grad_num
        self.repeat_value, self.repeat_streak, self.repeat_since = repeat_value, repeat_streak, repeat_since
        self.spike_at, self.spike_value, self.spike_age = spike_at, spike_value, spike_age
        self.tiny_since, self.tiny_grads = tiny_since, tiny_grads
        self.window, self.nonzero = window[RECUR_LOGS - filled:], nonzero
        return marks


def _tiny_under(first: float) -> float:
    """A loss under this is tiny: 2% of where the run started, never above 0.01."""
    relative = TINY_RELATIVE * first
    return relative if relative > TINY else TINY


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
        profile = self._ranks.get(rank)
        if profile is None:
            if not any(loss is not None and math.isfinite(loss) for loss in losses[lo:hi]):
                return {}  # a rank gets its profile with its first loss
            profile = self._ranks[rank] = RankProfile()
        return profile.run(losses, steps, grads, lo, hi)
