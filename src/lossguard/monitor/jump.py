"""The commit gate's loss-jump test (`recover=True`): a loss far above the run's own spread AND an abnormal update.

A high loss alone is data, not a fault: a switch to harder data, a rare hard batch, a new task all raise
the loss, and dropping those steps throws away exactly what the run has to learn. So the gate (monitor/
recover.py) holds a step for its loss only when the update it would apply is abnormal too: its gradient
norm far above the norms of the run's own recent steps (a non-finite norm is held on its own, as a
non-finite fault). A garbage batch, a numerical glitch, an LR blow-up move both at once; a hard batch moves
the loss and leaves the norm within a few times its usual size.

Loss: a step's loss on some rank is far above when above `typical + max(SPREADS x spread, RELATIVE x
|typical|, NATS)`; `typical` is the median of the recent values, `spread` their median absolute deviation
scaled to a normal sigma (robust: one earlier outlier moves neither). All three must be exceeded, so a flat
loss (a zero spread) or a loss near zero (tiny values, huge ratios) cannot make a step a jump.
Norm: far above when above both `typical + SPREADS x spread` of the recent norms and `1 + NORM_RELATIVE` times
the highest typical norm the run has had (`highest`, the median of the recent norms at its highest: usually
the first steps'). A converged run's norms are small; a switch to new data brings them back to about what
they were at the start, from an untrained model on that data: a ratio to the recent norms alone would hold
exactly the steps the run has to learn from.

Every step's values enter the history, held or not (a held step's values once the history is warm: see
`LossHistory.commit`), so a shift that persists becomes the run's new baseline and the limits follow it.

With no history yet (the first WARMUP steps) the same test runs against what the first steps show, with
a wider margin: a loss over EARLY_RATIO times theirs (with the norm over 1 + NORM_RELATIVE times theirs) is a
run diverging from its first steps (an LR 1000x too high), never a healthy start.

A DeepSpeed engine's gate measures each rank's partition norm before `step()` (adapters/ds_norm.py: the
engine's own norm comes only inside it). Where no gradient norm is measured before the step (the bf16
optimizer without ZeRO, an offloaded optimizer), the update cannot be judged and the loss test alone decides.

The value kept per step is the step's highest finite value over the ranks, and the value tested is the same
statistic: it is what both exchange paths know exactly (the gathered rows, and above the world-size
threshold the reduced summary's max), so every rank keeps the same history whichever path a step took;
and the history of the max already holds how far the highest of N healthy ranks strays at this world size.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

# How far above is "far" for the loss (a step is a jump only above all three, in nats of loss):
# - SPREADS: ten robust sigmas of the recent losses. Healthy noise, even heavy-tailed, reaches that about
#   never; a fault (a garbage batch, a numerical glitch) leaps far past it.
# - RELATIVE: and more than twice the typical value above it (over 3x the typical loss): the offline loss
#   spike (LOSS006, core/profile.py) opens at 3x the running average.
# - NATS: and at least half a nat above it, as LOSS006 asks: near a zero loss (memorisation) a ratio means
#   nothing and a flat loss has a zero spread.
SPREADS, RELATIVE, NATS = 10.0, 2.0, 0.5
# The norm: over three times the highest typical norm the run has had (and ten spreads above the recent
# norms), as the loss's RELATIVE. A cross-entropy's gradient per token is bounded (at most sqrt(2) times an
# untrained model's, when confidently wrong): a harder batch or a new task brings the norm back towards the
# run's first steps' (measured: 1.7x and 1.9x them), while an update that threw the weights out of their
# basin (one step at 10^4 x the LR: 4.7x), a poisoned batch or a blown-up LR goes past it.
NORM_RELATIVE = 2.0
# Before WARMUP values: a loss over this many times the typical of the first steps.
EARLY_RATIO = 1000.0
# Values the typical value and the spread are measured over: long enough for a median and a MAD that one
# odd step does not move, short enough to follow a loss that falls as the run trains.
WINDOW = 50
# Values before the spread is used: a median and a MAD of fewer than 20 values are too coarse to call
# anything "ten spreads", and the first steps are a run's steepest and noisiest.
WARMUP = 20
_SIGMA = 1.4826  # MAD x this = a normal distribution's standard deviation


@dataclass
class LossHistory:
    """The highest finite value over ranks of each recent step (the loss, or with `norm=True` the gradient
    norm)."""

    norm: bool = False
    recent: deque = field(default_factory=lambda: deque(maxlen=WINDOW))
    highest: float = 0.0  # the norm's: the highest typical value the run has had (its first steps' usually)

    @property
    def warm(self) -> bool:
        return len(self.recent) >= WARMUP

    def bound(self) -> tuple[float, float, float] | None:
        """(typical, spread, limit): a value above `limit` is far above the run's. None with no history."""
        if not self.recent:
            return None
        typical = statistics.median(self.recent)
        if self.norm:  # measured against the highest typical norm of the run, not only the recent one
            spread = _SIGMA * statistics.median(abs(value - typical) for value in self.recent) if self.warm else 0.0
            return typical, spread, max(typical + SPREADS * spread, (1.0 + NORM_RELATIVE) * max(typical, self.highest))
        if not self.warm:  # what the first steps show: their typical value, a wide margin, no spread yet
            return typical, 0.0, typical + max((EARLY_RATIO - 1.0) * abs(typical), NATS)
        spread = _SIGMA * statistics.median(abs(value - typical) for value in self.recent)
        return typical, spread, typical + max(SPREADS * spread, RELATIVE * abs(typical), NATS)

    def commit(self, peak: float | None, held: bool = False) -> None:
        """A step's highest finite value (None: no rank measured one). A held step's enters once the history
        is warm (one outlier moves neither median), not before: in the first steps a diverging run's own
        values would otherwise become its baseline at once."""
        if peak is not None and math.isfinite(peak) and not (held and not self.warm):
            self.recent.append(peak)
            if self.norm and not held:
                self.highest = max(self.highest, statistics.median(self.recent))
