"""DTensor (FSDP2's parameters and gradients) without a collective: whether a tensor is one, and this rank's
local part of it. A torch without DTensor has none."""

from __future__ import annotations

from typing import Any

import torch


def _dtensor_class() -> Any:
    try:
        from torch.distributed.tensor import DTensor
    except Exception:  # a torch without DTensor: nothing is an FSDP2 parameter
        return None
    return DTensor


def is_dtensor(tensor: Any) -> bool:
    cls = _dtensor_class()
    return cls is not None and isinstance(tensor, cls)


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor: a DTensor's local shard (no collective); any other tensor as it is."""
    return tensor.to_local() if is_dtensor(tensor) else tensor
