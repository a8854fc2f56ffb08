"""The loss profile: one per-rank summary of the training loss that every loss-trend detector reads.

The engine advances it once per train record, on both of its paths (`feed` and the batch path), with one
update loop (`RankProfile.run`, through `LossProfile.advance`): count, baseline, minimum, head and tail, the
runs of repeated and of high values, the gradient norm's mean, the run of tiny losses, and a running
average that leaves spikes out. Where a record may concern a trend rule (it repeats the loss before it, it
sits far above the run's start, a spike came back down, a run of repeats, an earlier stretch of losses
again), the loop hands the engine a `TrendMark`; the engine routes the record to the detectors that declare `reads_profile`, which find the mark
in `LossProfile.mark`. Every other train record costs the trend detectors nothing, and no detector keeps
a copy of these statistics.
"""

from __future__ import annotations

import collections
import math
import operator
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


# An LR this many times the one logged before it is a step change (a typo'd or injected LR, a warm restart).
LR_RISE = 10.0

# A loss this far above the reference (times it, and above it) is "far": divergence's fast rule.
FAR_FACTOR, FAR_ABOVE = 3.0, 3.0


@dataclass(frozen=True, slots=True)
class TrendMark:
    """What the loss profile held at a record it marked for the trend rules (core/detector.py `reads_profile`)."""

    seq: int  # this record's number among the rank's losses
    loss: float
    repeat: tuple[float, int, int | None]  # (value, run length, first step) of the run of equal losses
    reference: float | None  # the lowest start-of-run loss a divergence is judged against (None: none)
    high: bool  # over twice the reference and 2 above it
    high_run: tuple[int, int | None]  # (losses in a row that were high, the first one's step)
    far_run: tuple[int, int | None]  # (losses in a row over FAR_FACTOR x the reference and FAR_ABOVE above it, ...)
    spike: tuple[int | None, float, float] | None  # (step, value, x average) of a spike that came back down
    recurs: int | None  # the last RECUR_LOGS losses repeat those that ended this many losses earlier


# The state `RankProfile.run` works on in locals, in the order it unpacks it: one C call per run of records
# (the live path calls `run` once per record).
_load_state = operator.attrgetter(
    "num", "baseline_sum", "baseline", "minimum", "ema", "grad_sum", "grad_num", "repeat_value", "repeat_streak",
    "repeat_since", "high_run", "high_since", "far_run", "far_since", "spike_at", "spike_value", "spike_age",
    "tiny_since", "tiny_grads", "nonzero", "window")


class RankProfile:
    __slots__ = ("num", "baseline_sum", "baseline", "minimum", "ema", "first_step", "head", "tail",
                 "grad_sum", "grad_num", "repeat_value", "repeat_streak", "repeat_since", "high_run", "high_since",
                 "far_run", "far_since", "spike_at",
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
        self.high_run, self.high_since = 0, None  # consecutive losses far above the start (divergence)
        self.far_run, self.far_since = 0, None  # ... of them three times the start and 3 above it
        self.spike_at: int | None = None
        self.spike_value, self.spike_age = 0.0, 0
        self.tiny_since: int | None = None  # the run of logs under 2% of the first loss
        self.tiny_grads: set = set()
        self.window: tuple[float, ...] = ()  # the last RECUR_LOGS non-zero losses
        self.windows: dict[tuple[float, ...], int] = {}  # window -> its `nonzero` count where it ended
        self.nonzero = 0

    def run(self, losses: list, steps: list, grads: list, lo: int, hi: int) -> dict[int, TrendMark]:
        """Records lo..hi-1 of a run, in order (a None or non-finite loss is no loss here): index ->
        TrendMark where a trend rule must look. One loop, the state in locals: it runs per train record of a
        big log, where a call per statistic costs more than it (rare branches are helpers)."""
        (num, baseline_sum, baseline, minimum, ema, grad_sum, grad_num, repeat_value, repeat_streak,
         repeat_since, high_run, high_since, far_run, far_since, spike_at, spike_value, spike_age, tiny_since,
         tiny_grads, nonzero, window) = _load_state(self)
        head, tail, windows, filled = self.head, self.tail, self.windows, len(window)
        _, w1, w2, w3, w4, w5 = window = (None,) * (RECUR_LOGS - filled) + window
        isfinite, isclose = math.isfinite, math.isclose
        tiny, big_start = (_tiny_under(head[0]), head[0] > 10 * TINY) if head else (None, False)
        head_open = len(head) < HEAD_LOGS
        marks: dict[int, TrendMark] = {}
        for index in range(lo, hi):
            loss = losses[index]
            if loss is None or not isfinite(loss):
                continue
            step, grad, num = steps[index], grads[index], num + 1
            if num <= BASELINE_LOGS:
                baseline_sum += loss
                baseline = baseline_sum / BASELINE_LOGS if num == BASELINE_LOGS else baseline
            if head_open:  # the first HEAD_LOGS losses
                tiny, big_start, head_open = self._head(loss, step, tiny, big_start)
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
            if (loss < tiny and big_start) or tiny_since is not None or tiny_grads:
                tiny_since, tiny_grads = _tiny_run(loss, tiny, big_start, step, grad if grad_ok else None,
                                                   tiny_since, tiny_grads)
            reference = baseline if baseline and baseline < minimum else minimum
            valid = isfinite(reference) and reference > 0
            high = valid and loss > 2.0 * reference and loss > reference + 2.0
            if high:
                high_run, high_since, far_run, far_since = _high(loss, reference, step, high_run, high_since,
                                                                 far_run, far_since)
            elif high_run:  # far_run is 0 whenever high_run is
                high_run = far_run = 0
            spike = recurs = None
            if spike_at is not None:
                spike, spike_at, spike_age = _spike_window(loss, ema, spike_at, spike_value, spike_age)
            elif num > BASELINE_LOGS and ema and loss > 3.0 * ema and loss > ema + 0.5:  # a spike opens
                spike_at, spike_value, spike_age = step, loss, 0
            else:
                ema = loss if ema is None else 0.8 * ema + 0.2 * loss
            # How many non-zero losses ago the last RECUR_LOGS (six slots) came before (None: new or uniform).
            if loss != 0.0:
                nonzero += 1
                window = (w1, w2, w3, w4, w5, loss)
                if filled < RECUR_LOGS:
                    filled += 1
                distinct = (w1 != w2 and w2 != w3 and w1 != w3) or len(set(window)) >= _RECUR_DISTINCT
                if filled == RECUR_LOGS and distinct:  # the first time a window was seen is what counts
                    earlier = windows.setdefault(window, nonzero) if len(windows) < _RECUR_REMEMBER else \
                        windows.get(window, nonzero)
                    recurs = nonzero - earlier if earlier != nonzero else None
                w1, w2, w3, w4, w5 = w2, w3, w4, w5, loss
            # Beside a non-finite grad norm the logged loss is the NaN filter's stand-in: no new minimum.
            if (grad is None or grad_ok) and loss < minimum:
                minimum = loss
            if high or spike is not None or recurs is not None or repeat_streak >= REPEAT_LOGS:
                marks[index] = TrendMark(num, loss, (repeat_value, repeat_streak, repeat_since),
                                         reference if valid else None, high, (high_run, high_since),
                                         (far_run, far_since), spike, recurs)
        self.num, self.baseline_sum, self.baseline, self.minimum = num, baseline_sum, baseline, minimum
        self.ema, self.grad_sum, self.grad_num, self.nonzero = ema, grad_sum, grad_num, nonzero
        self.repeat_value, self.repeat_streak, self.repeat_since = repeat_value, repeat_streak, repeat_since
        self.high_run, self.high_since, self.far_run = high_run, high_since, far_run
        self.far_since, self.spike_at, self.spike_value = far_since, spike_at, spike_value
        self.spike_age = spike_age
        self.tiny_since, self.tiny_grads, self.window = tiny_since, tiny_grads, window[RECUR_LOGS - filled:]
        return marks

    def _head(self, loss: float, step: int | None, tiny: float | None,
              big_start: bool) -> tuple[float, bool, bool]:
        """One of the first HEAD_LOGS losses: kept, the first one's step noted, and the first sets what counts
        as tiny. (tiny, the run started far above tiny, head still open)"""
        if self.first_step is None:
            self.first_step = step
        self.head.append(loss)
        if tiny is None:
            tiny, big_start = _tiny_under(loss), loss > 10 * TINY
        return tiny, big_start, len(self.head) < HEAD_LOGS

def _high(loss: float, reference: float, step: int | None, high_run: int, high_since: int | None,
          far_run: int, far_since: int | None) -> tuple[int, int | None, int, int | None]:
    """A high loss extends the run of high losses, and the run of far ones when it is far too."""
    high_run, high_since = high_run + 1, step if high_run == 0 else high_since
    if loss > FAR_FACTOR * reference and loss > reference + FAR_ABOVE:
        return high_run, high_since, far_run + 1, step if far_run == 0 else far_since
    return high_run, high_since, 0, far_since


def _spike_window(loss: float, ema: float | None, at: int | None, value: float, age: int) -> tuple:
    """A log while a spike's window is open (the window neither moves the average nor opens another spike):
    it closes back under 1.5x the average, a recovered spike ((step, value, x average), marked), or after
    SPIKE_RECOVER_WITHIN logs (not recovered: divergence's business). (spike or None, open at, age)"""
    age += 1
    if ema is not None and loss < 1.5 * ema:
        return (at, value, value / ema), None, age
    return None, (None if age > SPIKE_RECOVER_WITHIN else at), age


def _tiny_run(loss: float, tiny: float, big_start: bool, step: int | None, grad: float | None,
              since: int | None, grads: set) -> tuple[int | None, set]:
    """The run of logs under 2% of the first loss (never above 0.01), with its first few finite grad norms:
    (where it began, its grad norms) after this loss."""
    if loss < tiny and big_start:
        if since is None:
            since = step
        if grad is not None and len(grads) < _TINY_GRADS:
            grads.add(grad)
    elif loss >= tiny and (since is not None or grads):  # a run is open: it ends
        since, grads = None, set()
    return since, grads


def _tiny_under(first: float) -> float:
    """A loss under this is tiny: 2% of where the run started, never above 0.01."""
    relative = TINY_RELATIVE * first
    return relative if relative > TINY else TINY


class LossProfile:
    """Every rank's profile (None = the run-level log), in the order ranks first logged a loss."""

    __slots__ = ("_ranks", "mark", "_last_lr", "lr_rise")

    def __init__(self) -> None:
        self._ranks: dict[int | None, RankProfile] = {}
        self.mark: TrendMark | None = None  # the record being observed, set by the engine
        self._last_lr: dict[int | None, float] = {}
        self.lr_rise: dict[int | None, int] = {}  # rank -> the loss number of its last LR step change

    def get(self, rank: int | None) -> RankProfile | None:
        return self._ranks.get(rank)

    def items(self):
        return self._ranks.items()

    def advance(self, rank: int | None, columns: dict[str, list], steps: list, lo: int, hi: int) -> dict[int, TrendMark]:
        """Train records lo..hi-1 of a run (one rank) from its columns: index -> TrendMark where marked."""
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
        if (lrs := columns.get("lr")) is not None:
            self._note_lr_rise(rank, profile.num, losses, lrs, lo, hi)
        return profile.run(losses, steps, grads, lo, hi)

    def _note_lr_rise(self, rank: int | None, num: int, losses: list, lrs: list, lo: int, hi: int) -> None:
        """The loss number (as `TrendMark.seq` counts them) of the last log whose LR rose LR_RISE-fold or more
        over the LR logged before it: a step change no warmup makes (linear warmup at most doubles from one
        log to the next; a start from 0 is no rise). A divergence right after one has its cause in sight."""
        last, rise = self._last_lr.get(rank), self.lr_rise.get(rank)
        # Most runs of records hold no step change: builtins over the slice tell (every LR finite and positive,
        # the highest under LR_RISE times the lowest, the previous one included) without the per-record loop.
        present = list(filter(None, lrs[lo:hi]))
        if not present:
            return
        low = min(present) if last is None else min(min(present), last)
        if low > 0 and math.isfinite(sum(present)) and max(present) < LR_RISE * low:
            self._last_lr[rank] = present[-1]
            return
        for index in range(lo, hi):
            loss = losses[index]
            if loss is not None and math.isfinite(loss):
                num += 1
            lr = lrs[index]
            if lr is None or not lr > 0:
                continue
            if last is not None and lr >= LR_RISE * last:
                rise = num + (0 if loss is not None and math.isfinite(loss) else 1)
            last = lr
        self._last_lr[rank] = last
        if rise is not None:
            self.lr_rise[rank] = rise
