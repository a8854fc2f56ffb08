"""Fault injection by real mechanisms: forward hooks and model surgery, keyed on the optimizer step.

Nothing here writes a log line. Each fault changes what the model computes (an infinite loss on one rank, a
hidden state pushed past the fp16 range, a causal mask opened up, a replica nudged on one rank) and lets the
real DeepSpeed / Trainer stack print whatever it prints. A fault spec is a plain dict held by the scenario:
`{"kind": ..., "step": k, "rank": r, ...}`; `step` is the 1-based optimizer step the Trainer logs.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn


class StepCounter:
    """The optimizer step being computed (1-based); the Trainer callback or the raw loop advances it."""

    def __init__(self) -> None:
        self.step = 1


def _lm(model: nn.Module) -> nn.Module:
    """The GPT-2 LM inside a PEFT wrapper or the VLM."""
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    return getattr(model, "lm", model)


def _active(spec: dict, counter: StepCounter, rank: int) -> bool:
    if spec.get("rank") is not None and spec["rank"] != rank:
        return False
    start = spec.get("step", 1)
    if spec.get("once", False):
        return counter.step == start
    return counter.step >= start


def _inf_loss(model: nn.Module, spec: dict, counter: StepCounter, rank: int) -> None:
    """Multiply the loss by +inf on one rank at one step: one non-finite gradient, then the rest is DeepSpeed's."""

    def hook(_module, _inputs, output):
        if _active(spec, counter, rank) and getattr(output, "loss", None) is not None:
            output.loss = output.loss * math.inf
        return output

    _lm(model).register_forward_hook(hook)


def _scale_hidden(model: nn.Module, spec: dict, counter: StepCounter, rank: int) -> None:
    """Scale the first block's output so fp16 activations pass 65504 (the hidden states of a model pre-trained in
    bf16 and run in fp16 do this on their own: known issue fp16-activation-overflow)."""
    factor = float(spec.get("factor", 1e7))

    def hook(_module, _inputs, output):
        if not _active(spec, counter, rank):
            return output
        if isinstance(output, tuple):
            return (output[0] * factor, *output[1:])
        return output * factor

    _lm(model).transformer.h[0].register_forward_hook(hook)


def _open_causal_mask(model: nn.Module, spec: dict, counter: StepCounter, rank: int) -> None:
    """Defeat the causal mask (known issue label-leakage): every position attends to the future, so the next token leaks
    in and the loss collapses towards 0 without any error."""
    lm = _lm(model)

    def pre_hook(_module, args, kwargs):
        # A custom 4-D additive mask of zeros ("attend everywhere"), as packed / bidirectional patches pass:
        # transformers uses a 4-D mask as given, so the causal triangle is gone.
        x = kwargs.get("input_ids") if kwargs.get("input_ids") is not None else kwargs.get("inputs_embeds")
        if x is None and args:
            x = args[0]
        batch, length = x.shape[0], x.shape[1]
        kwargs["attention_mask"] = torch.zeros(batch, 1, length, length, device=x.device)
        return args, kwargs

    lm.transformer.register_forward_pre_hook(pre_hook, with_kwargs=True)


def _perturb_replica(model: nn.Module, spec: dict, counter: StepCounter, rank: int) -> None:
    """Add noise to one rank's copy of the weights after the engine broadcast them (used by the raw loop,
    which calls `apply_post_init`)."""


FAULTS: dict[str, Callable[[nn.Module, dict, StepCounter, int], None]] = {
    "inf-loss": _inf_loss,
    "scale-hidden": _scale_hidden,
    "open-causal-mask": _open_causal_mask,
    "perturb-replica": _perturb_replica,
    "late-module": lambda *_args: None,  # applied by `after_optimizer`
}


def install(model: nn.Module, spec: dict | None, counter: StepCounter, rank: int) -> None:
    if not spec:
        return
    FAULTS[spec["kind"]](model, spec, counter, rank)


def after_optimizer(model: nn.Module, spec: dict | None) -> None:
    """Faults that need the optimizer to exist already (called from the Trainer's `on_train_begin`).

    `late-module`: rebuild the VLM projector, as code that swaps in a freshly built (or reloaded) projector
    after `deepspeed.initialize` does. The optimizer still holds the old module's parameters, which no longer
    take part in the forward; the new ones get gradients nobody applies (known issue trainable-not-optimized).
    """
    if not spec or spec.get("kind") != "late-module":
        return
    old = model.mm_projector
    new = type(old)(*[type(m)(m.in_features, m.out_features) if isinstance(m, nn.Linear) else type(m)()
                      for m in old])
    model.mm_projector = new.to(next(old.parameters()).dtype)


@torch.no_grad()
def perturb_replica(engine_module: nn.Module, spec: dict, rank: int) -> None:
    """After `deepspeed.initialize` (which broadcast rank 0's weights), nudge one rank's replica."""
    if spec.get("kind") != "perturb-replica" or rank != spec.get("rank", 1):
        return
    generator = torch.Generator().manual_seed(1234)
    for p in engine_module.parameters():
        p.add_(torch.randn(p.shape, generator=generator).to(p.dtype) * float(spec.get("scale", 0.05)))
