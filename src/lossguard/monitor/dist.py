"""Everything that touches `torch.distributed`: rank, world size and the one per-step gather.

Every rank calls `gather_rows` exactly once per optimizer step with a vector of the same length, so
the collective sequence is identical on every rank and nothing can deadlock. `gather_objects` runs
once, at the first step, for the non-numeric first-step facts (parameter names).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as torch_dist


def is_distributed() -> bool:
    return torch_dist.is_available() and torch_dist.is_initialized()


def rank() -> int:
    return torch_dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    return torch_dist.get_world_size() if is_distributed() else 1


def comm_device() -> torch.device:
    """The device the default process group's backend can gather from (CPU for gloo)."""
    if not is_distributed():
        return torch.device("cpu")
    backend = torch_dist.get_backend()
    if "nccl" in str(backend) and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def gather_rows(vector: torch.Tensor) -> list[list[float]]:
    """All ranks' vectors as Python lists, in rank order.

    SYNC POINT: the one host sync lossguard adds per optimizer step (all_gather + `.tolist()`).
    """
    if not is_distributed():
        return [vector.cpu().tolist()]
    out = torch.empty(world_size() * vector.numel(), dtype=vector.dtype, device=vector.device)
    gather = getattr(torch_dist, "all_gather_single", None) or torch_dist.all_gather_into_tensor
    gather(out, vector.contiguous())
    return out.view(world_size(), vector.numel()).cpu().tolist()


def gather_objects(obj: Any) -> list[Any]:
    """Picklable objects from every rank, in rank order. SYNC POINT: first step only."""
    if not is_distributed():
        return [obj]
    out: list[Any] = [None] * world_size()
    torch_dist.all_gather_object(out, obj)
    return out
