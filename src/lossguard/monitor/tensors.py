"""Per-rank tensor measurements. Everything here stays on the device (no host sync) unless the
function says SYNC POINT; the monitor moves the results to the host in its one per-step host copy (of
the gather, or of the reduced summary)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

IGNORE_INDEX = -100


def find_labels(args: tuple, kwargs: dict) -> torch.Tensor | None:
    """The `labels` tensor of a forward call or batch: keyword, mapping, attribute, or None."""
    for container in (kwargs, *args):
        labels = _labels_in(container)
        if labels is not None:
            return labels
    return None


def _labels_in(obj: Any) -> torch.Tensor | None:
    if isinstance(obj, torch.Tensor):
        return None
    if isinstance(obj, dict) or hasattr(obj, "keys"):
        try:
            value = obj.get("labels")
        except Exception:
            value = None
        return value if isinstance(value, torch.Tensor) else None
    value = getattr(obj, "labels", None)
    return value if isinstance(value, torch.Tensor) else None


def supervised_tokens(labels: torch.Tensor) -> torch.Tensor:
    """Tokens that count in the causal-LM loss: `labels[..., 1:] != -100` (the shift the model applies)."""
    if labels.dim() == 0:
        return (labels != IGNORE_INDEX).sum()
    return (labels[..., 1:] != IGNORE_INDEX).sum()


def output_loss(output: Any) -> torch.Tensor | None:
    """`loss` of a model output (ModelOutput, dict, tuple with the loss first, or a bare scalar)."""
    loss = None
    if isinstance(output, torch.Tensor):
        loss = output
    elif isinstance(output, dict) or hasattr(output, "keys"):
        try:
            loss = output.get("loss")
        except Exception:
            loss = None
    elif isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        loss = output[0]
    if isinstance(loss, torch.Tensor) and loss.numel() == 1:
        return loss.detach().reshape(())
    return None


def grad_norm(params: Iterable[torch.nn.Parameter]) -> torch.Tensor | None:
    """L2 norm of the gradients present (device tensor; inf/nan propagate)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return None
    norms = torch._foreach_norm(grads)
    return torch.linalg.vector_norm(torch.stack([n.to(torch.float32) for n in norms]))


def optimizer_params(optimizer: Any) -> list[torch.nn.Parameter] | None:
    """The model parameters an optimizer updates; unwraps accelerate and DeepSpeed wrappers.

    DeepSpeed's ZeRO optimizers keep flat partitions in `param_groups`; the original parameters are
    in `bit16_groups` (ZeRO-1/2), `fp16_groups` (ZeRO-3, fp16) or `bf16_groups` (BF16_Optimizer).
    """
    seen = set()
    while optimizer is not None and id(optimizer) not in seen:
        seen.add(id(optimizer))
        for attr in ("bit16_groups", "bf16_groups", "fp16_groups"):
            groups = getattr(optimizer, attr, None)
            if groups:
                return [p for group in groups for p in group]
        inner = getattr(optimizer, "optimizer", None)
        if inner is None or inner is optimizer:
            break
        optimizer = inner
    groups = getattr(optimizer, "param_groups", None)
    if groups is None:
        return None
    return [p for group in groups for p in group["params"]]


def unwrap_model(model: Any) -> torch.nn.Module:
    while hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
        model = model.module
    return model


def _is_zero3(param: torch.nn.Parameter) -> bool:
    return hasattr(param, "ds_id") and hasattr(param, "ds_tensor")


def fingerprint(model: torch.nn.Module) -> torch.Tensor | None:
    """A float64 fingerprint of the parameters this rank holds as a replica (device tensor), or None when
    it holds none.

    Position-weighted sums and norms, so a changed, swapped or rescaled tensor moves it. ZeRO-3
    parameters are left out: each lives once in the world, as the shards of its fp32 master, and DeepSpeed
    re-gathers every full copy from those shards at every step (persistent ones included), so ranks can
    never disagree on them. Leaving them out also keeps this free of collectives: gathering a 7B model's
    embedding on every rank for a print would cost a full-model all-gather and could run a rank out of
    memory.
    """
    params = list(model.parameters())
    total = None
    for index, param in enumerate(params):
        if _is_zero3(param):
            continue
        term = _tensor_print(param.data) * (1.0 + index / len(params))
        total = term if total is None else total + term
    return total


def _tensor_print(tensor: torch.Tensor) -> torch.Tensor:
    # Reduce in the tensor's own precision and widen only the two scalars: asking torch for float64
    # reductions materialises a float64 copy of every weight (9x slower on CPU in bench/overhead.py).
    # Identical replicas still give bit-identical prints, which is what the ranks compare.
    # bf16/fp16 results would round the print to 8-11 bits: those accumulate into float32.
    wide = torch.float32 if tensor.dtype in (torch.float16, torch.bfloat16) else None
    return (torch.sum(tensor, dtype=wide).double()
            + torch.linalg.vector_norm(tensor, dtype=wide).double())


class UpdateSampler:
    """Largest |Δw|/|w| per module group, from a fixed sample of each trainable parameter.

    `snapshot()` copies at most `sample_size` elements of every parameter (ZeRO-3: of this rank's
    partition); `ratios()` after the optimizer step compares. Memory and time stay tiny at any scale.
    """

    def __init__(self, named_params: list[tuple[str, torch.nn.Parameter]], groups: list[str],
                 assign: dict[str, str], sample_size: int) -> None:
        self.groups = groups
        self.items = [(assign[name], param) for name, param in named_params]
        self.sample_size = sample_size
        self.saved: list[torch.Tensor] | None = None

    def _views(self) -> list[torch.Tensor]:
        views = []
        for _, param in self.items:
            data = param.ds_tensor if _is_zero3(param) else param.data
            views.append(data.reshape(-1)[: self.sample_size])
        return views

    def snapshot(self) -> None:
        self.saved = [v.detach().float().clone() for v in self._views()]

    def ratios(self) -> list[torch.Tensor] | None:
        if self.saved is None:
            return None
        now = [v.detach().float() for v in self._views()]
        device = now[0].device if now else torch.device("cpu")
        delta_sq = {g: torch.zeros((), device=device) for g in self.groups}
        base_sq = {g: torch.zeros((), device=device) for g in self.groups}
        for (group, _), old, new in zip(self.items, self.saved, now):
            if old.numel() == 0:
                continue
            delta_sq[group] = delta_sq[group] + torch.sum((new - old) ** 2)
            base_sq[group] = base_sq[group] + torch.sum(old**2)
        self.saved = None
        return [torch.sqrt(delta_sq[g]) / torch.sqrt(base_sq[g]).clamp_min(1e-30) for g in self.groups]


def assign_groups(named_params: list[tuple[str, torch.nn.Parameter]],
                  module_groups: dict[str, list[str]] | None) -> tuple[list[str], dict[str, str]]:
    """(group names, param name -> group). User groups match name substrings; the rest is automatic."""
    assign: dict[str, str] = {}
    for name, _ in named_params:
        group = None
        for group_name, needles in (module_groups or {}).items():
            if any(needle in name for needle in needles):
                group = group_name
                break
        if group is None:
            group = "lora" if "lora_" in name else _top_module(name)
        assign[name] = group
    return sorted(set(assign.values())), assign


def _top_module(name: str) -> str:
    parts = name.split(".")
    # peft wraps the model as base_model.model.<...>
    while parts and parts[0] in ("base_model", "model", "module") and len(parts) > 2:
        parts = parts[1:]
    return parts[0] if len(parts) > 1 else "other"


class GradWatch:
    """First-step gradient watch: which trainable parameters got a gradient, and a non-zero one.

    Tensor hooks fire during backward before DeepSpeed moves gradients into its partitions, so this
    works under ZeRO-1/2/3 and DDP. Removed after the first optimizer step.
    """

    def __init__(self, named_params: list[tuple[str, torch.nn.Parameter]]) -> None:
        self.names = [name for name, _ in named_params]
        self.seen = [False] * len(named_params)
        self.nonzero: list[torch.Tensor | None] = [None] * len(named_params)
        self.handles = [param.register_hook(self._hook(i)) for i, (_, param) in enumerate(named_params)]

    def _hook(self, index: int):
        def hook(grad: torch.Tensor) -> None:
            self.seen[index] = True
            flag = (grad != 0).any()
            prev = self.nonzero[index]
            self.nonzero[index] = flag if prev is None else (prev | flag)

        return hook

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def no_grad(self) -> list[str]:
        """Names without a gradient or with an all-zero one. SYNC POINT: first step only.

        LoRA `lora_A` matrices are exempt from the all-zero rule: `lora_B` starts at zero, so their
        first gradient is exactly zero by design."""
        self.remove()
        flags = [f for f in self.nonzero if f is not None]
        values = torch.stack(flags).cpu().tolist() if flags else []
        it = iter(values)
        out = []
        for name, seen, flag in zip(self.names, self.seen, self.nonzero):
            if not seen or flag is None or not next(it) and "lora_A" not in name:
                out.append(name)
        return out
