"""A committed step's post-step signals, read one exchange later (DeepSpeed with `recover`).

Under DeepSpeed the gradient norm, the skipped-step count and the loss scale of an optimizer step exist only
after `engine.step()`: the ZeRO optimizer computes the norm inside it. The commit gate must decide before the
step, from the step's exchange (loss, labels). So with recovery on, a committed step's gathered rows wait
here (`Pending`) while its post-step values stay on the device (no read, no sync); the next step's exchange,
whose host copy has already waited for the device, reads them (`complete`) and the step goes to the
detectors then. The values are the same on every rank (DeepSpeed all-reduces the norm and the overflow
flag), so each rank writes them into every rank's row itself: no collective. A halt the completed step
calls for happens before the next step is applied; `Monitor.close` completes the last step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from lossguard.monitor import summary, wire

# (post-step value, its slot, its PRESENT bit)
_POST = (("grad_norm", wire.GRAD_NORM, wire.HAS_GRAD_NORM), ("loss_scale", wire.LOSS_SCALE, wire.HAS_SCALE),
         ("skipped_steps", wire.SKIPPED, wire.HAS_SKIPPED))


@dataclass
class Pending:
    """A committed step waiting for its post-step values: what its exchange returned."""

    step: int
    rows: list[list[float]] | None
    seen: summary.Summary | None
    own: list[float] | None
    leading: list[Any] = field(default_factory=list)


def complete(pending: Pending, post: dict[str, Any], world_size: int) -> None:
    """Write the post-step values (device tensors or numbers; read here) into the pending step's rows, its
    own row and its summary, as if every rank had sent them with the step."""
    values = [(slot, bit, _read(post.get(name))) for name, slot, bit in _POST]
    values = [(slot, bit, value) for slot, bit, value in values if value is not None]
    rows = list(pending.rows or []) + ([pending.own] if pending.own is not None else [])
    for row in rows:
        if wire.failed(row):
            continue
        for slot, bit, value in values:
            row[slot] = value
            row[wire.PRESENT] = float(int(row[wire.PRESENT]) | bit)
    if pending.seen is not None:
        _into_summary(pending.seen, values, world_size - pending.seen.errors)


def _read(value: Any) -> float | None:
    """SYNC POINT, free: called after the next exchange's host copy, which the device had to reach first."""
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _into_summary(seen: summary.Summary, values: list[tuple[int, int, float]], ranks: float) -> None:
    """The summary of slots every live rank (`ranks` of them) holds with the same value."""
    for slot, _, value in values:
        finite = math.isfinite(value)
        seen.present[slot] = ranks
        seen.total[slot] = value * ranks if finite else 0.0
        seen.nonfinite[slot] = 0.0 if finite else ranks
        seen.zeros[slot] = ranks if value == 0.0 else 0.0
        seen.high[slot] = value if finite else -math.inf
        seen.low[slot] = value if finite else math.inf
