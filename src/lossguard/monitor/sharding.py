"""Which parameters a rank holds only a shard of, under PyTorch FSDP (FSDP1 and FSDP2), and the run facts
that say which engine shards them.

FSDP2 (`torch.distributed.fsdp.fully_shard`) turns each parameter into a DTensor whose placements include a
`Shard`; `to_local()` is this rank's shard, read without a collective. FSDP1 (`FullyShardedDataParallel`)
flattens a wrapped module's parameters into one `FlatParameter` per wrap, sharded across the ranks; with
`use_orig_params=True` the original parameters stay, as views into this rank's part of it (some of them
empty on some ranks). FSDP marks both with `_fsdp_flattened`. Under `NO_SHARD` every rank holds the whole
tensor: those are replicas, as under DDP.

A sharded parameter lives once in the world (per replica group under HSDP / HYBRID_SHARD): ranks hold no
replicas of it to compare (no fingerprint), its update ratio is the shard's, and its gradient's squared
norm is summed over the ranks. `weights` gives each its share of that sum: 1, or 1/R where R ranks hold the
same shard (HSDP), so that the sum over every rank counts each element once.
"""

from __future__ import annotations

from typing import Any

import torch

from lossguard.monitor import tensors
from lossguard.monitor.dtensor import is_dtensor


class Split:
    """A model's trainable parameters split into FSDP shards (with their shares) and the rest, and the
    gradient-norm slots of a step's row from them."""

    def __init__(self, model: torch.nn.Module, trainable: list[tuple[str, torch.nn.Parameter]], world_size: int) -> None:
        shares = weights(model, [p for _, p in trainable], world_size)
        self.sharded = [(p, shares[id(p)]) for _, p in trainable if id(p) in shares]
        self.names = [n for n, p in trainable if id(p) in shares]
        self.ids = frozenset(shares)
        self.replicated = [p for _, p in trainable if id(p) not in shares]

    def __bool__(self) -> bool:
        return bool(self.sharded)

    def norm_slots(self, grad_norm: Any) -> tuple[Any, Any]:
        """(GRAD_NORM, GRAD_SQ) of this rank's row for the norm an entry point gave: a norm that is the run's
        (a plain tensor or number, a DTensor replicated on every rank) as it is; none, or a partial DTensor,
        under sharding: the replicated gradients' norm and this rank's share of the shards' squared norm,
        folded into the run's in the exchange (wire.fold_shard_norms). Device ops, no collective."""
        if self.sharded and (grad_norm is None or (is_dtensor(grad_norm) and not all(
                p.is_replicate() for p in grad_norm.placements))):
            return tensors.grad_norm(self.replicated), tensors.sharded_grad_sq(self.sharded)
        return (grad_norm.to_local() if is_dtensor(grad_norm) else grad_norm), None


def _fsdp1_modules(model: torch.nn.Module) -> list[Any]:
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except Exception:
        return []
    return [m for m in model.modules() if isinstance(m, FullyShardedDataParallel)]


def _fsdp2_modules(model: torch.nn.Module) -> list[Any]:
    try:
        from torch.distributed.fsdp import FSDPModule
    except Exception:
        return []
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def facts(model: torch.nn.Module) -> dict[str, Any]:
    """`sharding_engine` ("fsdp1" or "fsdp2") and FSDP1's sharding strategy, when the model is sharded so;
    empty otherwise (DeepSpeed's facts come from its engine)."""
    try:
        if _fsdp2_modules(model):
            return {"sharding_engine": "fsdp2"}
        wrapped = _fsdp1_modules(model)
        if wrapped:
            strategy = getattr(wrapped[0], "sharding_strategy", None)
            return {"sharding_engine": "fsdp1",
                    "fsdp_sharding_strategy": getattr(strategy, "name", None) if strategy is not None else None}
    except Exception:  # a model whose modules cannot be walked: no facts, never an error
        pass
    return {}


def weights(model: torch.nn.Module, params: list[torch.nn.Parameter], world_size: int) -> dict[int, float]:
    """id(param) -> its share of the summed squared gradient norm, for the parameters in `params` that this
    rank holds a shard of; replicas (and anything not FSDP's) are left out."""
    out: dict[int, float] = {}
    try:
        fsdp1 = _fsdp1_share(model, world_size)
    except Exception:  # a process group that cannot be asked its size: FULL_SHARD over every rank
        fsdp1 = 1.0
    for param in params:
        if is_dtensor(param):
            try:
                share = _dtensor_share(param)
            except Exception:  # a mesh that cannot be read: a shard of one copy, FSDP2's default
                share = 1.0
        elif getattr(param, "_fsdp_flattened", False) or getattr(param, "_is_flat_param", False):
            share = fsdp1
        else:
            share = None
        if share is not None:
            out[id(param)] = share
    return out


def _dtensor_share(param: Any) -> float | None:
    """1 / (ranks holding the same shard), or None for a DTensor replicated on every mesh dimension."""
    placements = getattr(param, "placements", ())
    if not any(p.is_shard() for p in placements):
        return None
    mesh = param.device_mesh
    replicas = 1
    for dim, placement in enumerate(placements):
        if placement.is_replicate():
            replicas *= mesh.size(dim)
    return 1.0 / replicas


def _fsdp1_share(model: torch.nn.Module, world_size: int) -> float | None:
    """FSDP1: None under NO_SHARD (replicas), else 1 / (world size / the shard group's size). Flagged
    parameters with no FSDP module in sight (an entry point handed the module inside the wrapper): sharded
    over every rank, FULL_SHARD's default."""
    wrapped = _fsdp1_modules(model)
    if not wrapped:
        return 1.0
    root = wrapped[0]
    strategy = getattr(getattr(root, "sharding_strategy", None), "name", "FULL_SHARD")
    if strategy == "NO_SHARD":
        return None
    group = getattr(root, "process_group", None)
    size = group.size() if group is not None else world_size
    return size / max(world_size, 1)
