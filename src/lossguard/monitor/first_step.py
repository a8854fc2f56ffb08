"""What the first optimizer step tells about the run's set-up, once: trainable parameters the optimizer does
not hold, and trainable parameters that got no gradient."""

from __future__ import annotations

from typing import Any

from lossguard.core.records import Record, event
from lossguard.monitor import tensors


def events(model: Any, optimizer: Any, grad_watch: tensors.GradWatch, num_trainable: int, rank: int) -> list[Record]:
    out = []
    in_opt = tensors.optimizer_params(optimizer) if optimizer is not None else None
    if in_opt is not None:
        ids = {id(p) for p in in_opt}
        missing = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in ids]
        if missing:
            out.append(event("trainable-not-in-optimizer", 1, rank, params=missing[:50], count=len(missing)))
    no_grad = grad_watch.no_grad()
    if no_grad:
        out.append(event("no-grad", 1, rank, params=no_grad[:50], count=len(no_grad), num_trainable=num_trainable))
    return out
