"""Snapshots of a torch optimizer over FSDP2 parameters (`fully_shard`: DTensor parameters and state).

Adam's moments of a DTensor parameter are DTensors too: a host copy of the whole tensor would gather it from
every rank. `OptimizerShards` gives the ring the optimizer's `state_dict` with each DTensor state tensor
replaced by this rank's local shard (`to_local()`, no collective), and at a restore rebuilds the DTensors
around the saved shards (`DTensor.from_local(..., run_check=False)`: no collective) before handing them to
the optimizer's own `load_state_dict`, which also gives back the param groups' LRs. Every rank restores at
the same step (the rollback is decided from the exchanged reports), so the shards fit together again. The
model's shards are `snapshots.Trainable`'s.
"""

from __future__ import annotations

from typing import Any

import torch

from lossguard.monitor import sizing
from lossguard.monitor.dtensor import is_dtensor, local

# The key of a snapshot's optimizer state that names, per parameter index, the state entries held as shards
_SHARDED = "lossguard_dtensor_keys"


def holds(optimizer: Any, model: torch.nn.Module) -> bool:
    """Whether `optimizer` should be snapshotted as `OptimizerShards`: a torch optimizer of a model with
    DTensor parameters."""
    return isinstance(optimizer, torch.optim.Optimizer) and any(is_dtensor(p) for p in model.parameters())


class OptimizerShards:
    """A torch optimizer over DTensor parameters, as the ring sees an optimizer."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    def state_dict(self) -> dict[str, Any]:
        saved = self.optimizer.state_dict()
        state, sharded = {}, {}
        for index, entry in saved["state"].items():
            state[index] = {k: local(v.detach()) if is_dtensor(v) else v for k, v in entry.items()}
            keys = [k for k, v in entry.items() if is_dtensor(v)]
            if keys:
                sharded[index] = keys
        return {**saved, "state": state, _SHARDED: sharded}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """`saved`: a copy the optimizer may keep (the ring hands a fresh one, `Ring.restore`)."""
        saved = dict(saved)
        sharded = saved.pop(_SHARDED, {})
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        state = {}
        for index, entry in saved["state"].items():
            keys = sharded.get(index, ())
            state[index] = {k: _rebuild(v, params[index]) if k in keys else v for k, v in entry.items()}
        self.optimizer.load_state_dict({**saved, "state": state})

    def lazy_bytes(self) -> int:
        return sizing.lazy_bytes(self.optimizer)


def _rebuild(shard: torch.Tensor, param: Any) -> Any:
    """The DTensor laid out as `param` around this rank's saved `shard` (no collective)."""
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(shard.to(local(param).device), param.device_mesh, param.placements,
                              run_check=False, shape=param.shape, stride=param.stride())
