"""DeepSpeed's batch-parameter resolution, in pure Python, so lint errs exactly where DeepSpeed refuses.

Mirrors `deepspeed/runtime/config.py` `DeepSpeedConfig._set_batch_related_parameters` and
`_batch_assertion` (unchanged 0.3 -> 0.19): of train_batch_size (T), train_micro_batch_size_per_gpu (M)
and gradient_accumulation_steps (G), DeepSpeed derives the missing ones with integer division by the
world size W, then asserts T == M x G x W and that each is > 0. An absent G is *derived*, not taken as 1.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BatchCheck", "check_batch"]


@dataclass(frozen=True, slots=True)
class BatchCheck:
    total: int | None
    micro: int | None
    ga: int | None
    refusal: str | None  # DeepSpeed's own assertion message, or None when it starts


def resolve_for_world(total: int | None, micro: int | None, ga: int | None, world: int) -> BatchCheck:
    """What DeepSpeed makes of the three keys on `world` ranks (None = key absent)."""
    if total is not None and micro is not None and ga is None:
        ga = total // micro // world
    elif total is not None and ga is not None and micro is None:
        micro = total // world // ga if ga else 0
    elif micro is not None and ga is not None and total is None:
        total = micro * ga * world
    elif total is not None and micro is None and ga is None:
        ga, micro = 1, total // world
    elif micro is not None and total is None and ga is None:
        total, ga = micro * world, 1
    elif total is None and micro is None:
        return BatchCheck(None, None, ga, "Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided")
    return BatchCheck(total, micro, ga, _assertion(total, micro, ga, world))


def _assertion(total: int, micro: int, ga: int, world: int) -> str | None:
    if total <= 0:
        return f"Train batch size: {total} has to be greater than 0"
    if micro <= 0:
        return f"Micro batch size per gpu: {micro} has to be greater than 0"
    if ga <= 0:
        return f"Gradient accumulation steps: {ga} has to be greater than 0"
    if total != micro * ga * world:
        return ("Check batch related parameters. train_batch_size is not equal to micro_batch_per_gpu * "
                f"gradient_acc_step * world_size {total} != {micro} * {ga} * {world}")
    return None


def check_batch(total: int | None, micro: int | None, ga: int | None, world: int | None) -> BatchCheck:
    """DeepSpeed's verdict for a known world size; for an unknown one, a refusal only when no world size
    (1..1024) lets DeepSpeed start, reported for world size 1 (the message DeepSpeed prints there)."""
    if world:
        return resolve_for_world(total, micro, ga, world)
    if total is None and micro is None:
        return BatchCheck(None, None, ga, None)  # the HF Trainer / accelerate fill these: not a refusal here
    for candidate in range(1, 1025):
        if resolve_for_world(total, micro, ga, candidate).refusal is None:
            return BatchCheck(total, micro, ga, None)
    return resolve_for_world(total, micro, ga, 1)
