"""Snapshots and rollback under DeepSpeed (`attach` / the Trainer callback with `RecoverOptions(snapshot_every=S)`).

The ring, the decision and the record are monitor/snapshots.py's, as for `Guard`; what differs is what a
rank's state is. Under ZeRO no rank holds a full `state_dict` without collectives, and a snapshot must not
make one. So each rank keeps host copies of the tensors it OWNS, in place, by reference:

- ZeRO-1/2: the flat 16-bit (or fp32) parameter groups every rank holds whole (the module's parameters are
  views into them) and this rank's fp32 master partition;
- ZeRO-3: this rank's 16-bit and fp32 partitions, and the parameters kept whole on every rank (those under
  the persistence threshold);
- no ZeRO (a torch optimizer): the module's parameters;
- always: the inner optimizer's state tensors (Adam's moments and step, of this rank's partition), its
  param groups' LRs, the loss scaler's numbers, and the LR scheduler.

`ShardState` and `OptimizerState` give those the `state_dict` / `load_state_dict` / `parameters` shape the
ring works with; a restore copies every tensor back in place (the engine keeps holding the same storage),
so after a rollback every rank holds the state it had at the snapshot's step, with no collective. About
(2 + 4) bytes per parameter / ranks for bf16 ZeRO-1/2 masters, plus 2 bytes per parameter for the whole
16-bit groups, plus 8 bytes per parameter / ranks of Adam moments.
"""

from __future__ import annotations

from typing import Any

import torch

_SCALER = ("cur_scale", "cur_iter", "last_overflow_iter", "cur_hysteresis")


def supported(engine: Any) -> str | None:
    """None when this engine's optimizer is one whose state is known here; else why not."""
    optimizer = engine.optimizer
    if _flats(optimizer) or isinstance(optimizer, torch.optim.Optimizer):
        return None
    return f"{type(optimizer).__name__} (snapshots know ZeRO-1/2/3 and a plain torch optimizer)"


# The optimizer's flat groups a rank owns (attribute names of DeepSpeed 0.10-0.19), and whether every
# replica holds them alike: ZeRO-1/2's whole 16-bit groups do; fp32 and ZeRO-3 partitions are the rank's own.
_FLATS = (("bit16_groups_flat", True), ("single_partition_of_fp32_groups", False),
          ("fp16_partitioned_groups_flat", False), ("fp32_partitioned_groups_flat", False))


def _owned(optimizer: Any) -> list[tuple[torch.Tensor, bool]]:
    out = []
    for name, replicated in _FLATS:
        for tensor in getattr(optimizer, name, None) or []:
            if isinstance(tensor, torch.Tensor) and tensor.numel():
                out.append((tensor, replicated))
    return out


def _flats(optimizer: Any) -> list[torch.Tensor]:
    return [tensor for tensor, _ in _owned(optimizer)]


class ShardState:
    """This rank's weights, as the ring sees a model."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def _owned(self) -> list[tuple[torch.Tensor, bool]]:
        """(tensor, held alike by every replica) for each tensor this rank owns."""
        flats = _owned(self.engine.optimizer)
        if not flats:  # no ZeRO: the module's own parameters
            return [(p.data, True) for p in self.engine.module.parameters()]
        whole = [(p.data, True) for p in self.engine.module.parameters()
                 if hasattr(p, "ds_tensor") and p.data.numel()]  # ZeRO-3: kept whole on every rank
        return flats + whole

    def _tensors(self) -> list[torch.Tensor]:
        return [tensor for tensor, _ in self._owned()]

    def replicated(self) -> list[str]:
        """The keys of the tensors every replica holds alike (a drift is judged on those)."""
        return [f"t{i}" for i, (_, alike) in enumerate(self._owned()) if alike]

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {f"t{i}": t for i, t in enumerate(self._tensors())}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for i, tensor in enumerate(self._tensors()):
                tensor.copy_(state[f"t{i}"])

    def parameters(self) -> list[torch.Tensor]:
        return self._tensors()


class OptimizerState:
    """The inner optimizer's state tensors, LRs and the loss scaler's numbers, as the ring sees an optimizer.
    A restore copies every tensor back in place (`copies_in_place`): the ring's snapshot is read as it is,
    with no fresh copy, so a rollback needs no host memory beyond the ring (monitor/sizing.py)."""

    copies_in_place = True

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def lazy_bytes(self) -> int:
        """The state the inner optimizer will make at its first step for the partitions it holds none for yet
        (ZeRO makes Adam's at the engine's start; a plain torch optimizer at its first step): counted as
        Adam's two moments of each, for the start's sizing."""
        inner = self._inner()
        return sum(2 * p.numel() * p.element_size() for p in self._keys(inner) if p not in inner.state)

    def _inner(self) -> Any:
        optimizer = self.engine.optimizer
        return getattr(optimizer, "optimizer", optimizer) if _flats(optimizer) else optimizer

    def _keys(self, inner: Any) -> list[Any]:
        """What the inner optimizer's state is keyed by: ZeRO's fp32 partitions (ZeRO-3 empties its param
        groups between steps, so they cannot be read from there), else the param groups' parameters."""
        for name in ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat"):
            flats = getattr(self.engine.optimizer, name, None)
            if flats:
                return list(flats)
        return [p for g in inner.param_groups for p in g["params"]]

    def state_dict(self) -> dict[str, Any]:
        inner = self._inner()
        params = self._keys(inner)
        state = {i: dict(inner.state[p]) for i, p in enumerate(params) if p in inner.state}
        scaler = getattr(self.engine.optimizer, "loss_scaler", None)
        numbers = {k: getattr(scaler, k) for k in _SCALER if isinstance(getattr(scaler, k, None), (int, float))}
        return {"state": state, "lrs": [g["lr"] for g in inner.param_groups], "scaler": numbers}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        inner = self._inner()
        params = self._keys(inner)
        with torch.no_grad():
            for i, param in enumerate(params):  # no state at the snapshot (before the first step): none now
                if i not in saved["state"]:
                    inner.state.pop(param, None)
            for i, values in saved["state"].items():
                live = inner.state[params[i]]
                for key, value in values.items():
                    if isinstance(live.get(key), torch.Tensor) and isinstance(value, torch.Tensor):
                        live[key].copy_(value)
                    else:
                        live[key] = value
        for group, lr in zip(inner.param_groups, saved["lrs"]):
            group["lr"] = lr
        scaler = getattr(self.engine.optimizer, "loss_scaler", None)
        for key, value in saved["scaler"].items():
            setattr(scaler, key, value)
