"""DeepSpeed's engine progress line: `[Rank 0] step=10, skipped=0, lr=[1e-05, 1e-05], mom=[(0.9, 0.999)]`.

It names the optimizer step, the cumulative count of skipped (overflowed) steps and the first param
group's learning rate (the catalog's `lr`).

    >>> fields = read(b"[Rank 0] step=10, skipped=2, lr=[1e-05, 1e-05], mom=[(0.9, 0.999)]")
    >>> fields.step, fields.signals
    (10, {'skipped_steps': 2.0, 'lr': 1e-05})
    >>> read(b"step=10, skipped=0, lr=[auto], mom=[]").signals
    {'skipped_steps': 0.0}
    >>> read(b"global_step=10") is None
    True
"""

from __future__ import annotations

from lossguard.sources import patterns as P
from lossguard.sources.readers.fields import Fields, Form


def read(line: bytes) -> Fields | None:
    # `DS_STEP.search(line)`, a third as costly: the regex is tried only where its first literal is.
    at, match = line.find(b"step="), None
    while at >= 0 and (match := _STEP_LINE(line, at)) is None:
        at = line.find(b"step=", at + 1)
    if match is None:
        return None
    step, skipped, first_lr = match.groups()
    try:
        signals = {"skipped_steps": float(skipped), "lr": float(first_lr)}
    except ValueError:  # an LR that is no number (`lr=[auto]`): the step and the skips still are
        signals = {"skipped_steps": float(skipped)}
    return Fields(Form.DS_STEP, signals, int(step))


_STEP_LINE = P.DS_STEP.match
