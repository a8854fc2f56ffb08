"""What the first optimizer step tells about the run's set-up, once: trainable parameters the optimizer does
not hold, and trainable parameters that got no gradient (FSDP shards: no rank got one, `no_grad_shards`)."""

from __future__ import annotations

from typing import Any

import torch

from lossguard.core.records import Record, event
from lossguard.monitor import tensors
from lossguard.monitor.dtensor import local


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


def shard_grads(split: Any) -> list[bool] | None:
    """Per FSDP shard this rank holds (`sharding.Split`), whether its gradient is there and non-zero; None
    without shards, or when they cannot be read. FSDP sets a shard's gradient after its reduce-scatter, not
    through autograd, so GradWatch's hooks cannot see it. SYNC POINT: first step only, one copy."""
    if not split:
        return None
    try:
        flags = [(local(p.grad) != 0).any() if p.grad is not None else None for p, _ in split.sharded]
        read = [f for f in flags if f is not None]
        values = iter(torch.stack([f.to(read[0].device) for f in read]).cpu().tolist() if read else [])
        return [bool(next(values)) if f is not None else False for f in flags]
    except Exception:
        return None


def no_grad_shards(split: Any, gathered: list[list[bool] | None], num_trainable: int) -> list[Record]:
    """The shards no rank holds a non-zero gradient of, as one `no-grad` event of the run (rank None; every
    rank builds it alike from the same gathered flags). Said only when some shard has one: with none at all
    the gradients were dropped before the guard looked (the Trainer zeroes them before `on_step_end`).
    LoRA `lora_A` is exempt, as in GradWatch (`lora_B` starts at zero)."""
    rows = [row for row in gathered if row is not None]
    if not rows or len(rows) != len(gathered) or len({len(row) for row in rows}) != 1:
        return []
    got = [any(column) for column in zip(*rows)]
    if not any(got):
        return []
    missing = [name for name, ok in zip(split.names, got) if not ok and "lora_A" not in name]
    if not missing:
        return []
    return [event("no-grad", 1, None, params=missing[:50], count=len(missing), num_trainable=num_trainable)]
