"""Holding one DeepSpeed optimizer step: DeepSpeed's own overflow path, taken on purpose.

Every DeepSpeed optimizer already knows how to skip a step cleanly, because an fp16 overflow asks for
exactly that: drop the reduced gradients wherever this stage keeps them (ZeRO-1/2 partitions and buckets,
ZeRO-3 sub-groups, the bf16 optimizer's fp32 accumulators), leave weights and optimizer state untouched,
and tell the engine (`optimizer.overflow`) so that it leaves the LR scheduler alone. `hold` makes the next
`engine.step()` take that path:

- ZeRO-1/2/3 and the fp16 optimizers decide it in `_update_scale(overflow)`: shadowed on the instance for
  the one step, it marks the overflow and does not touch the loss scale (an fp16 scaler is left exactly as
  before, where a real overflow would halve it);
- the bf16 optimizer (no ZeRO) has no scaler: its `step` is shadowed by its own overflow branch;
- a plain torch optimizer (no ZeRO, fp32): its `step` is shadowed by a no-op and `overflow` set, so the
  engine clears the gradients and skips the scheduler as after an overflow.

The collectives are the ones a real overflow step makes (the norm's all-reduce and the rest), the same on
every rank: every rank holds together (the gate's decision is the same everywhere). The step and sample
counts move on as for any step DeepSpeed skips (the Trainer's count does too), so step numbers stay the
engine's and each held attempt has its own. The optimizer's `overflow` flag stays set until the next step
clears it: it is how accelerate (`step_was_skipped`) tells the Trainer not to step an LR scheduler the
engine does not own. The counts that would read as a real overflow are put back: `skipped_steps` and the
reported grad norm (inf); lossguard reports the held step itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lossguard.monitor.adapters.instance import noop_step, shadow

_COUNTERS = ("skipped_steps", "_global_grad_norm")


def hold(engine: Any, run_step: Callable[[], Any], *, counted: bool = True) -> None:
    """Run `run_step` (the engine's own `step`) so that it applies nothing, then put the counters back.
    `counted=False` (gradients dropped before a replay, whose own step is the one that counts): the step
    and sample counts too."""
    names = _COUNTERS if counted else (*_COUNTERS, "global_steps", "global_samples", "micro_steps")
    counters = {name: getattr(engine, name) for name in names if hasattr(engine, name)}
    undo = _force_overflow(engine.optimizer)
    try:
        run_step()
    finally:
        undo()
        for name, value in counters.items():
            setattr(engine, name, value)


def _force_overflow(optimizer: Any) -> Callable[[], None]:
    """Shadow what decides the optimizer's overflow, on the instance; the function that takes it back."""
    if hasattr(optimizer, "_update_scale"):
        def _update_scale(*args: Any, **kwargs: Any) -> None:
            optimizer.overflow = True  # the optimizer's own overflow branch follows; the scale stays as it is

        return shadow(optimizer, "_update_scale", _update_scale)
    if hasattr(optimizer, "clear_hp_grads") and hasattr(optimizer, "clear_lp_grads"):
        def bf16_step(*args: Any, **kwargs: Any) -> None:
            optimizer.overflow = True
            optimizer.clear_hp_grads()
            optimizer.clear_lp_grads()

        return shadow(optimizer, "step", bf16_step)
    undo_flag, undo_step = shadow(optimizer, "overflow", True), noop_step(optimizer)

    def undo() -> None:
        undo_step()
        undo_flag()

    return undo


def count_skipped(engine: Any) -> None:
    """What DeepSpeed's step counts for a step it skips, for a held step whose gradients a replay dropped
    with `counted=False` (the replay faulted again: no step of its own follows)."""
    engine.global_steps += 1
    engine.micro_steps += 1
    engine.global_samples += engine.train_batch_size()
