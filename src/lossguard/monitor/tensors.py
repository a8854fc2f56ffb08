"""Per-rank tensor measurements. Everything here stays on the device (no host sync) unless the
function says SYNC POINT; the monitor moves the results to the host in its one per-step host copy (of
the gather, or of the reduced summary)."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import torch

from lossguard.monitor.dtensor import is_dtensor, local

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


def loss_items(kwargs: dict, shifted: bool = True) -> torch.Tensor | None:
    """A micro-batch's count of the items a Trainer normalises a summed loss by (`num_items_in_batch` is
    the sum of these over the step's micro-batches, and over the ranks), counted as transformers counts
    them: `shift_labels != -100` when the batch has them, else `labels[..., 1:] != -100` where the
    Trainer knows the model's loss shifts the labels (transformers >= 5, `_loss_shifts_labels`), else
    every label that is not -100 (so for a model whose loss type it does not know, e.g. GPT-2 in
    transformers 5.24, a sequence of n labels counts n although n - 1 are predicted). Device op."""
    shift = kwargs.get("shift_labels")
    if isinstance(shift, torch.Tensor):
        return (shift != IGNORE_INDEX).sum()
    labels = kwargs.get("labels")
    if not isinstance(labels, torch.Tensor):
        return None
    if shifted and labels.dim() > 0:
        return (labels[..., 1:] != IGNORE_INDEX).sum()
    return (labels != IGNORE_INDEX).sum()


def output_loss(output: Any, detach: bool = True) -> torch.Tensor | None:
    """`loss` of a model output (ModelOutput, dict, tuple with the loss first, or a bare scalar); detached
    for measuring, or (`detach=False`, a replay's) as the graph's own 0-d tensor to run backward from."""
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
        return loss.detach().reshape(()) if detach else loss.reshape(())
    return None


def grad_norm(params: Iterable[torch.nn.Parameter]) -> torch.Tensor | None:
    """L2 norm of the gradients present on this rank (device tensor; inf/nan propagate). A sharded gradient
    (FSDP2's DTensor) counts by its local shard: no collective here; the run's norm of sharded gradients
    is `sharded_grad_sq`, summed over the ranks in the step's exchange."""
    grads = [local(p.grad) for p in params if p.grad is not None]
    if not grads:
        return None
    norms = torch._foreach_norm(grads)
    return torch.linalg.vector_norm(torch.stack([n.to(torch.float32) for n in norms]))


def sharded_grad_sq(params: list[tuple[torch.nn.Parameter, float]]) -> torch.Tensor | None:
    """This rank's share of the squared gradient norm of sharded parameters, (parameter, share) pairs
    (monitor/sharding.py `weights`): the sum of share * |local shard of the gradient|^2, a float64 device
    tensor (inf/nan propagate), None without a gradient. One multi-tensor kernel per (device, dtype)."""
    present = [(local(p.grad), share) for p, share in params if p.grad is not None]
    if not present:
        return None
    total = None
    for positions, grads in _by_device_and_dtype([grad for grad, _ in present]):
        squares = torch.stack(_norms(grads)).double() ** 2
        shares = [present[i][1] for i in positions]
        term = squares.sum() * shares[0] if len(set(shares)) == 1 else \
            (squares * torch.tensor(shares, dtype=torch.float64, device=squares.device)).sum()
        total = term if total is None else total + term.to(total.device)
    return total


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


def fingerprint(model: torch.nn.Module, sharded: frozenset[int] = frozenset()) -> torch.Tensor | None:
    """A float64 fingerprint of the parameters this rank holds as a replica (device tensor), or None when
    it holds none.

    The position-weighted sum of every tensor's L2 norm, so a changed, swapped or rescaled tensor moves it.
    One multi-tensor kernel per (device, dtype) reads every parameter (`torch._foreach_norm`), not a few
    kernels and Python steps per parameter: on a GPU such a loop costs more in launches than the reading.
    ZeRO-3 parameters are left out: each lives once in the world, as the shards of its fp32 master, and
    DeepSpeed re-gathers every full copy from those shards at every step (persistent ones included), so
    ranks can never disagree on them. Leaving them out also keeps this free of collectives: gathering a 7B
    model's embedding on every rank for a print would cost a full-model all-gather and could run a rank out
    of memory. The same holds for FSDP's shards (`sharded`: their ids, monitor/sharding.py) and for any
    DTensor: a rank holds no replica of them. A parameter on the meta device holds no values to print.
    """
    params = [p.data for p in model.parameters()
              if not _is_zero3(p) and id(p) not in sharded and not is_dtensor(p) and not p.is_meta]
    if not params:
        return None
    total = None
    for positions, tensors in _by_device_and_dtype(params):
        norms = torch.stack(_norms(tensors)).double()
        term = (norms * _position_weights(positions, len(params), tensors[0].device)).sum()
        total = term if total is None else total + term
    return total


_HALF = (torch.float16, torch.bfloat16)


def _by_device_and_dtype(tensors: list[torch.Tensor]) -> list[tuple[tuple[int, ...], list[torch.Tensor]]]:
    """(positions, tensors) per (device, dtype): a multi-tensor kernel takes one of each."""
    groups: dict[tuple, tuple[list[int], list[torch.Tensor]]] = {}
    for index, tensor in enumerate(tensors):
        positions, members = groups.setdefault((tensor.device, tensor.dtype), ([], []))
        positions.append(index)
        members.append(tensor)
    return [(tuple(positions), members) for positions, members in groups.values()]


def _norms(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """The L2 norm of each tensor (one dtype and device). Identical replicas give bit-identical norms, which
    is what the ranks compare; bf16/fp16 norms would round the print to 8-11 bits, so those accumulate and
    return in float32 (no float32 copy of any weight is made)."""
    wide = torch.float32 if tensors[0].dtype in _HALF else None
    return list(torch._foreach_norm(tensors, 2, dtype=wide))


@functools.lru_cache(maxsize=64)
def _position_weights(positions: tuple[int, ...], count: int, device: torch.device) -> torch.Tensor:
    """1 + position / count for each tensor, on the device: copied there once, not per fingerprint."""
    return torch.tensor([1.0 + index / count for index in positions], dtype=torch.float64).to(device)


class UpdateSampler:
    """Largest |Δw|/|w| per module group, from a fixed sample of each trainable parameter.

    `snapshot()` copies at most `sample_size` leading elements of every parameter (ZeRO-3: of this rank's
    partition; FSDP: of this rank's shard) into one flat float32 buffer; `ratios()` after the optimizer step
    compares: a concatenation, a subtraction, two multi-tensor norms and two sums by group, whatever the
    number of parameters. Memory and time stay tiny at any scale. A parameter it cannot read is left out,
    with why, in `skipped` (the monitor says it once): the ratios of the rest still count.
    """

    def __init__(self, named_params: list[tuple[str, torch.nn.Parameter]], groups: list[str],
                 assign: dict[str, str], sample_size: int) -> None:
        self.groups = groups
        self.sample_size = sample_size
        self.saved: torch.Tensor | None = None
        self.skipped: list[tuple[str, str]] = []  # (parameter name, why it cannot be read)
        self._said = 0
        self.items: list[tuple[int, torch.nn.Parameter]] = []
        self._names: list[str] = []
        for name, param in named_params:
            self._keep(name, groups.index(assign[name]), param)

    def _keep(self, name: str, group: int, param: torch.nn.Parameter) -> None:
        why = unreadable(param)
        if why is None:
            self.items.append((group, param))
            self._names.append(name)
        else:
            self.skipped.append((name, why))

    def _sample(self) -> torch.Tensor:
        """The leading elements of every parameter, as one flat float32 tensor on the first one's device
        (torch.cat promotes mixed dtypes; a model split over GPUs sends its samples over device to device).
        A parameter that turns unreadable is dropped (and the last snapshot with it: its layout changed)."""
        try:
            return self._cat()
        except Exception:
            items, names = self.items, self._names
            self.items, self._names, self.saved = [], [], None
            for name, (group, param) in zip(names, items):
                self._keep(name, group, param)
            return self._cat()

    def _cat(self) -> torch.Tensor:
        views = [_partition(param).detach().reshape(-1)[: self.sample_size] for _, param in self.items]
        if not views:
            return torch.zeros(0)
        device = views[0].device
        return torch.cat([view.to(device) for view in views]).float()

    def snapshot(self) -> None:
        """The sample to compare with after the step (a new tensor: torch.cat copies). Never raises: a
        sample that fails even after dropping what cannot be read leaves no snapshot (no ratio next)."""
        try:
            self.saved = self._sample()
        except Exception as exc:
            self.saved = None
            self.skipped.append(("(the sample)", f"{type(exc).__name__}: {str(exc)[:200]}"))

    def unsaid(self) -> list[tuple[str, str]]:
        """The parameters skipped since the last call: each is said once."""
        new, self._said = self.skipped[self._said:], len(self.skipped)
        return new

    def ratios(self, keep: bool = False) -> list[torch.Tensor] | None:
        """Per group, the change since the snapshot. `keep`: the sample taken now is the next snapshot (the
        weights do not move before the next step: a second sample would read the same values)."""
        if self.saved is None:  # no snapshot to compare with (a resumed run's first step): start one
            self.saved = self._sample() if keep else None
            return None
        old = self.saved
        now = self._sample()
        if self.saved is None:  # a parameter was dropped while sampling: the snapshot no longer lines up
            self.saved = now if keep else None
            return None
        self.saved = now if keep else None
        if not self.items:
            return []
        sizes = [min(_partition(param).numel(), self.sample_size) for _, param in self.items]
        # Per parameter, then per group: the flat sample split back into views (no copy) and reduced by
        # one multi-tensor kernel each.
        delta_sq = torch.stack(_norms(list((now - old).split(sizes)))) ** 2
        base_sq = torch.stack(_norms(list(old.split(sizes)))) ** 2
        index = _group_index(tuple(group for group, _ in self.items), now.device)
        zeros = torch.zeros(len(self.groups), device=now.device)
        by_group = zeros.index_add(0, index, delta_sq).sqrt() / zeros.index_add(0, index, base_sq).sqrt().clamp_min(1e-30)
        return list(by_group.unbind())


def unreadable(param: torch.nn.Parameter) -> str | None:
    """Why this rank cannot read a flat view of its part of `param` (None: it can). Tried once per
    parameter, at the start (and again only if a sample fails)."""
    try:
        part = _partition(param)
        if part.is_meta:
            return "on the meta device: never materialised"
        part.detach().reshape(-1)[:1]
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc)[:200]}"
    return None


def _partition(param: torch.nn.Parameter) -> torch.Tensor:
    """The part of a parameter this rank holds: ZeRO-3's partition, FSDP2's local shard, FSDP1's flat shard
    (or, with `use_orig_params`, this rank's view of it), else the whole tensor."""
    return param.ds_tensor if _is_zero3(param) else local(param.data)


@functools.lru_cache(maxsize=16)
def _group_index(groups: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """Each sampled parameter's group, on the device: copied there once."""
    return torch.tensor(groups, dtype=torch.long).to(device)


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


def on_device_factor(value: Any, device: torch.device) -> torch.Tensor | float:
    """A multiplier for a device value without a copy the host waits for: a tensor already on that device
    stays there; a number, or a CPU tensor beside a GPU loss, is read where it is (the host)."""
    if isinstance(value, torch.Tensor) and value.device == device:
        return value.to(torch.float64)
    return float(value)

