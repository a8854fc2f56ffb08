"""The gradient norm a DeepSpeed gate judges a step's update by, read before `engine.step()`.

The commit gate holds a loss jump only when the update is abnormal too (monitor/jump.py): a high loss with
an ordinary gradient norm is data (a switch to harder data, a rare hard batch), and holding it throws away
what the run has to learn. DeepSpeed computes its global norm inside `step()`, after the gate has decided,
so without a norm of its own the gate judged a jump by the loss alone, held every step of a switch to harder
data, replayed it (the loss jumped again) and rolled back or halted on the budget.

So each rank sends the norm of the gradients it holds when `step()` is called: ZeRO-1/2/3 keep this rank's
reduced partition in `optimizer.averaged_gradients` (what DeepSpeed's own norm is computed from, before
its all-reduce), without ZeRO the averaged `.grad` of every parameter. Divided by the fp16 loss scale. A
device op, no host read, no collective: the step's exchange carries it, and the gate takes the highest over
the ranks (monitor/recover.py), a statistic it compares with its own history only. The norm the events
record for a committed step stays the engine's, read after the step (monitor/deferred.py). None (the loss
alone decides, as before) where the gradients are not found: the bf16 optimizer, an offloaded optimizer.
"""

from __future__ import annotations

from typing import Any

import torch


def pre_step_norm(engine: Any) -> torch.Tensor | None:
    """This rank's gradient norm at the accumulation boundary, before `engine.step()`; None if not found."""
    optimizer = engine.optimizer
    partitions = getattr(optimizer, "averaged_gradients", None)
    if partitions is not None:
        groups = partitions.values() if isinstance(partitions, dict) else partitions
        grads = [g for group in groups if group is not None for g in group if g is not None]
    elif hasattr(optimizer, "param_groups") and not hasattr(optimizer, "clear_hp_grads"):  # no ZeRO, no bf16 optimizer
        grads = [p.grad for p in engine.module.parameters() if p.grad is not None]
    else:
        return None
    if not grads:
        return None
    norm = torch.linalg.vector_norm(torch.stack([n.to(torch.float32) for n in torch._foreach_norm(grads)]))
    scale = getattr(optimizer, "loss_scale", None) if engine.fp16_enabled() else None
    try:
        scale = float(scale) if scale is not None else 1.0  # a Python number on every DeepSpeed optimizer
    except (TypeError, ValueError):
        scale = 1.0
    return norm / scale if scale > 0 else norm

