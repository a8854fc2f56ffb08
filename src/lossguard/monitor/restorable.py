"""What a snapshot holds beside the weights and the optimizer: the LR schedulers and the fp16 GradScaler.

The LR scheduler. A rollback that restores the optimizer's LRs but not the scheduler's step count leaves the
scheduler to set the LR of the snapshot's step + the steps undone at its next `step()`: a warm-up or decay
off by those steps for the rest of the run. Every entry point that knows the run's schedulers hands them in
(the Trainer's and the DeepSpeed engine's `lr_scheduler`, Lightning's `lr_scheduler_configs`, `Guard(...,
scheduler=)`). Where none was handed in, `find` looks for them: a torch LR scheduler keeps a strong
reference to its optimizer (`scheduler.optimizer`), so the schedulers of a run are among the objects that
refer to its optimizer (`gc.get_referrers`, once, when snapshots are switched on at the first step: one walk
of the heap, never per step). Finding them beats refusing to snapshot without `scheduler=`: the user who
forgot it still gets a whole rollback, and the start line names what was found (or that none was: a constant
LR needs none). A hand-written schedule that sets `group["lr"]` from its own counter is not found; its LRs
come back with the optimizer's state, its counter does not (docs/live.md says so).

Every scheduler found is held (`Schedulers`): a SequentialLR and the schedulers it chains all refer to the
optimizer, and restoring each of them to its own saved state restores them all alike.
"""

from __future__ import annotations

import gc
from typing import Any

import torch


def _is_scheduler(obj: Any) -> bool:
    bases = tuple(c for c in (getattr(torch.optim.lr_scheduler, "LRScheduler", None),
                              getattr(torch.optim.lr_scheduler, "_LRScheduler", None),
                              getattr(torch.optim.lr_scheduler, "ReduceLROnPlateau", None)) if c is not None)
    return isinstance(obj, bases)


def find(*optimizers: Any) -> list[Any]:
    """The torch LR schedulers bound to any of `optimizers` (their `.optimizer`), oldest first; [] when none.
    One heap walk per optimizer (the scheduler, or its `__dict__`, refers to the optimizer)."""
    found: list[Any] = []
    for optimizer in (o for o in optimizers if o is not None):
        for holder in gc.get_referrers(optimizer):
            owners = [holder] if _is_scheduler(holder) else \
                [o for o in gc.get_referrers(holder) if _is_scheduler(o)] if isinstance(holder, dict) else []
            found.extend(o for o in owners if getattr(o, "optimizer", None) is optimizer
                         and all(o is not f for f in found))
    return found


class Schedulers:
    """Several LR schedulers as one `state_dict` / `load_state_dict` (a snapshot's scheduler slot)."""

    def __init__(self, schedulers: list[Any]) -> None:
        self.schedulers = schedulers

    def state_dict(self) -> list[dict[str, Any]]:
        return [s.state_dict() for s in self.schedulers]

    def load_state_dict(self, states: list[dict[str, Any]]) -> None:
        for scheduler, state in zip(self.schedulers, states):
            scheduler.load_state_dict(state)

    def names(self) -> str:
        return ", ".join(type(s).__name__ for s in self.schedulers)


def bundle(schedulers: list[Any]) -> Any:
    """One scheduler as itself, several as `Schedulers`, none as None."""
    return None if not schedulers else schedulers[0] if len(schedulers) == 1 else Schedulers(schedulers)


def name(scheduler: Any) -> str:
    return scheduler.names() if isinstance(scheduler, Schedulers) else type(scheduler).__name__


class ScalerState:
    """A torch.amp GradScaler's scale and growth tracker, as the device tensors it keeps: the ring copies them
    like weights (no `.item()`, so no host sync on the normal path) and a restore copies them back in place.
    Empty before the scaler's first `scale()` (it makes them then); restoring that empties the live scaler,
    which makes them again from its `init_scale` at its next `scale()`."""

    def __init__(self, scaler: Any) -> None:
        self.scaler = scaler

    def state_dict(self) -> dict[str, torch.Tensor]:
        scale, growth = getattr(self.scaler, "_scale", None), getattr(self.scaler, "_growth_tracker", None)
        return {} if scale is None or growth is None else {"scale": scale, "growth": growth}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if not state:
            self.scaler._scale, self.scaler._growth_tracker = None, None
            return
        if getattr(self.scaler, "_scale", None) is None:
            device = getattr(self.scaler, "_device", "cpu")
            self.scaler._scale = state["scale"].to(device, copy=True)
            self.scaler._growth_tracker = state["growth"].to(device, copy=True)
            return
        with torch.no_grad():
            self.scaler._scale.copy_(state["scale"])
            self.scaler._growth_tracker.copy_(state["growth"])


def scaler_state(scaler: Any) -> ScalerState | None:
    """The scaler's state for a snapshot, None without an enabled GradScaler."""
    try:
        return ScalerState(scaler) if scaler is not None and scaler.is_enabled() else None
    except Exception:
        return None
