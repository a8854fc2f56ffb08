"""Everything that touches `torch.distributed`: rank, world size, the per-step reduction and gather.

Each optimizer step every rank makes the same calls with tensors of the same length: `reduce_summary`
(the summary every rank learns, monitor/summary.py), and `gather_rows` on the steps the monitor looks at
rank by rank; the choice comes from values every rank holds alike, so the collective sequence is
identical on every rank and nothing can deadlock. `gather_objects` runs once, at the first step, for
the non-numeric first-step facts (parameter names).
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

    SYNC POINT: one host sync (all_gather + `.tolist()`): on every step below the world-size threshold
    (the only sync there), else on the steps the monitor looks at rank by rank.
    """
    if not is_distributed():
        return [vector.cpu().tolist()]
    out = torch.empty(world_size() * vector.numel(), dtype=vector.dtype, device=vector.device)
    gather = getattr(torch_dist, "all_gather_single", None) or torch_dist.all_gather_into_tensor
    gather(out, vector.contiguous())
    return out.view(world_size(), vector.numel()).cpu().tolist()


def reduce_summary(sums: torch.Tensor, maxes: torch.Tensor, own: torch.Tensor) -> tuple[list[float], list[float]]:
    """(the summary every rank gets: `sums` summed and `maxes` maxed over the ranks; this rank's own row).

    Two all_reduce calls, because one carries one operation: they are launched together (`async_op`) and
    waited for on the device stream, so the host waits once. SYNC POINT: the one host sync of a step
    that needs no detail (one `.tolist()` of the reduced values and this rank's row, one copy).
    """
    if is_distributed():
        pending = [torch_dist.all_reduce(sums, op=torch_dist.ReduceOp.SUM, async_op=True),
                   torch_dist.all_reduce(maxes, op=torch_dist.ReduceOp.MAX, async_op=True)]
        for work in pending:
            work.wait()
    values = torch.cat([sums, maxes, own]).tolist()
    cut = sums.numel() + maxes.numel()
    return values[:cut], values[cut:]


def gather_objects(obj: Any) -> list[Any]:
    """Picklable objects from every rank, in rank order. SYNC POINT: first step only."""
    if not is_distributed():
        return [obj]
    out: list[Any] = [None] * world_size()
    torch_dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    """Every rank waits until all are here. SYNC POINT: once, before the exit after a halt (`exit_code_on_halt`),
    so that no rank exits (and has the launcher stop the others) while another still writes its checkpoint."""
    if is_distributed():
        torch_dist.barrier()
