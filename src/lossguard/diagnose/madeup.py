"""REC002: a logged loss the Trainer's NaN filter made up, in a run that trained on past it.

With `logging_nan_inf_filter` (on by default) a rank whose step loss is NaN or Inf adds, instead, the mean
of its losses since the last log; at `logging_steps=1` that is nothing, so the rank counts 0 and the logged
loss, the ranks' mean, is the other ranks' share: exactly 0.0 on one rank (or when every rank faulted),
half the loss on two ranks with one faulting (a real two-rank Trainer run whose guard replayed the step:
4.35, 2.165, 4.289). Had that NaN been applied, every later loss would be NaN too; a log that goes on at
its level means the step was not applied: lossguard's `recover=True` held it, or an overflow check
skipped it. Read alone, such a log shows no fault at all; this says one happened (a warning, never a
death), and where the record of what was done is.
"""

from __future__ import annotations

from lossguard.core.findings import Finding, Severity

# Neighbours within this share of their mean are a steady loss; a made-up value is within this share of half
# of it (two ranks, one faulting), or exactly 0.0.
_STEADY, _HALF = 0.1, 0.02


def made_up_steps(losses: dict[int, float]) -> list[tuple[int, float, float, float]]:
    """(step, value, previous, next) for each logged loss that is the NaN filter's made-up value between two
    steady neighbours, in step order."""
    steps = sorted(losses)
    out = []
    for before, step, after in zip(steps, steps[1:], steps[2:]):
        prev, value, nxt = losses[before], losses[step], losses[after]
        if not (prev > 0 and nxt > 0 and value == value and value >= 0):  # finite positive neighbours
            continue
        mean = (prev + nxt) / 2
        if mean == float("inf") or abs(prev - nxt) > _STEADY * mean:
            continue
        if value == 0.0 or abs(value / mean - 0.5) <= _HALF:
            out.append((step, value, prev, nxt))
    return out


def made_up_finding(losses: dict[int, float], ordinal: bool) -> Finding | None:
    found = made_up_steps(losses)
    if not found:
        return None
    at = "log #" if ordinal else "step "
    step, value, prev, nxt = found[0]
    more = f" (and {len(found) - 1} more such log(s))" if len(found) > 1 else ""
    return Finding("REC002", "made-up-loss", Severity.WARNING,
                   f"the loss logged at {at}{step} is " + ("0.0 between" if value == 0.0 else f"{value:.4g}, half")
                   + f" the steady loss around it ({prev:.4g}, {nxt:.4g}){more}: what the Trainer's NaN filter logs for a step "
                   "whose loss was NaN/Inf on some rank(s). The run trained on at its level, so that step was not "
                   "applied: lossguard's recover=True held it, or an overflow check skipped it. Read the guard's "
                   "events dir (or the job's stderr with its `recovered at step` lines) beside this log for what "
                   "was done", step=step, data={"steps": [f[0] for f in found]})
