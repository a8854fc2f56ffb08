"""The commit gate's loss-jump test (`recover=True`): a step whose loss leaps far above the run's own spread.

The gate (monitor/recover.py) keeps the losses of the steps it committed and, once it has enough of them,
holds a step whose loss on some rank is above `typical + max(SPREADS x spread, RELATIVE x |typical|, NATS)`:
`typical` is the median of the recent committed values, `spread` their median absolute deviation scaled to
a normal sigma (robust: one earlier outlier moves neither). All three must be exceeded, so a flat loss (a
zero spread) or a loss near zero (tiny values, huge ratios) cannot hold a healthy step.

The value kept per step is the step's highest finite loss over the ranks, and the value tested is the same
statistic: it is what both exchange paths know exactly (the gathered rows, and above the world-size
threshold the reduced summary's max), so every rank keeps the same history whichever path a step took;
and the history of the max already holds how far the highest of N healthy ranks strays at this world size
(the mean over ranks would be sqrt(N) times too calm: a noisy but healthy rank would stand out against it).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

# How far above is "far" (a step is held only above all three, in nats of loss):
# - SPREADS: ten robust sigmas of the recent committed losses. Healthy noise, even heavy-tailed, reaches
#   that about never; a fault (a garbage batch, a numerical glitch) leaps far past it.
# - RELATIVE: and more than twice the typical value above it (over 3x the typical loss): the offline loss
#   spike (LOSS006, core/profile.py) opens at 3x the running average, so the gate holds nothing the offline
#   detector would not call a spike.
# - NATS: and at least half a nat above it, as LOSS006 asks: near a zero loss (memorisation) a ratio means
#   nothing and a flat loss has a zero spread.
SPREADS, RELATIVE, NATS = 10.0, 2.0, 0.5
# Committed steps the typical value and the spread are measured over: long enough for a median and a MAD
# that one odd step does not move, short enough to follow a loss that falls as the run trains (the median
# lags above a falling loss: the test only gets more lenient there).
WINDOW = 50
# Committed steps before the test is on: a median and a MAD of fewer than 20 values are too coarse to call
# anything "ten spreads", and the first steps are a run's steepest and noisiest.
WARMUP = 20
_SIGMA = 1.4826  # MAD x this = a normal distribution's standard deviation


@dataclass
class LossHistory:
    """The highest loss over ranks of each recently committed step (a held step never enters it)."""

    recent: deque = field(default_factory=lambda: deque(maxlen=WINDOW))

    def bound(self) -> tuple[float, float, float] | None:
        """(typical, spread, limit): a loss above `limit` is a jump. None while warming up."""
        if len(self.recent) < WARMUP:
            return None
        typical = statistics.median(self.recent)
        spread = _SIGMA * statistics.median(abs(value - typical) for value in self.recent)
        return typical, spread, typical + max(SPREADS * spread, RELATIVE * abs(typical), NATS)

    def commit(self, peak: float | None) -> None:
        """A committed step's highest finite loss (None: no rank measured one)."""
        if peak is not None and math.isfinite(peak):
            self.recent.append(peak)
