"""`lossguard.attach(engine)`: the live guard on a raw DeepSpeed engine.

Wraps the engine instance's `forward`, `backward` and `step` (the class is untouched): the forward
hook reads the labels, `backward` the raw loss, and `step` at an accumulation boundary ends the
optimizer step. On a halt every rank saves a checkpoint (when `halt_checkpoint_dir` is set) and
`step()` raises `LossguardHalt`; with `exit_code_on_halt`, `detach()` then exits with that status.
"""

from __future__ import annotations

import contextlib
from typing import Any

from lossguard.monitor import tensors
from lossguard.monitor.core import Monitor
from lossguard.monitor.guard import LossguardHalt, exit_after_halt
from lossguard.monitor.options import GuardOptions, refuse_recover


def engine_facts(engine: Any) -> dict[str, Any]:
    """RunFacts fields the engine knows (versions, ZeRO stage, precision, overlap_comm, ...)."""
    import deepspeed

    facts: dict[str, Any] = {"deepspeed_version": deepspeed.__version__, "entry_point": "deepspeed"}
    for name, getter in (("zero_stage", "zero_optimization_stage"), ("bf16", "bfloat16_enabled"),
                         ("fp16", "fp16_enabled"), ("gradient_accumulation_steps", "gradient_accumulation_steps"),
                         ("overlap_comm", "zero_overlap_comm"), ("contiguous_gradients", "zero_contiguous_gradients")):
        with contextlib.suppress(Exception):
            facts[name] = getattr(engine, getter)()
    try:
        facts["reduce_bucket_size"] = engine.zero_reduce_bucket_size()
        facts["check_grad_overflow"] = bool(getattr(engine.optimizer, "check_grad_overflow", None) or False) \
            if facts.get("bf16") else None
    except Exception:
        pass
    return {k: v for k, v in facts.items() if v is not None}


def engine_signals(engine: Any) -> dict[str, Any]:
    """grad_norm (before clipping), lrs, loss_scale, skipped_steps as the engine reports them (device
    tensors kept). The LRs are those of the moment: read before `engine.step()` they are the step's."""
    out: dict[str, Any] = {"skipped_steps": getattr(engine, "skipped_steps", None)}
    try:
        out["grad_norm"] = engine.get_global_grad_norm()
    except Exception:
        out["grad_norm"] = None
    out["lrs"] = _engine_lrs(engine)
    if engine.fp16_enabled():
        optimizer = engine.optimizer
        scale = getattr(optimizer, "loss_scale", None)
        if scale is None:
            scale = getattr(getattr(optimizer, "loss_scaler", None), "cur_scale", None)
        out["loss_scale"] = scale
    return out


def _engine_lrs(engine: Any) -> list[float] | None:
    try:
        return [float(lr) for lr in engine.get_lr()]
    except Exception:
        return None


class Attachment:
    """What `attach` returns: the monitor plus `detach()`."""

    def __init__(self, engine: Any, options: GuardOptions, halt_checkpoint_dir: str | None) -> None:
        self.engine = engine
        self.halt_checkpoint_dir = halt_checkpoint_dir
        module = engine.module
        self.monitor = Monitor(options, module, optimizer=engine.optimizer, facts=engine_facts(engine),
                               entry="deepspeed")
        self._labels: list[Any] = []
        self._hook = module.register_forward_pre_hook(self._pre_forward, with_kwargs=True)
        self._orig_backward, self._orig_step = engine.backward, engine.step
        engine.backward, engine.step = self._backward, self._step

    def _pre_forward(self, module, args, kwargs):
        labels = tensors.find_labels(args, kwargs)
        if labels is not None:
            self._labels.append(labels)

    def _backward(self, loss, *args, **kwargs):
        labels = self._labels.pop() if self._labels else None
        self._labels.clear()
        self.monitor.observe_micro(loss=loss, labels=labels)
        return self._orig_backward(loss, *args, **kwargs)

    def _step(self, *args, **kwargs):
        boundary = self.engine.is_gradient_accumulation_boundary()
        # The LRs this optimizer step uses: `engine.step()` steps the engine's LR scheduler after the
        # optimizer, so what `get_lr()` says afterwards is the next step's.
        lrs = _engine_lrs(self.engine) if boundary else None
        result = self._orig_step(*args, **kwargs)
        if boundary:
            step = self.engine.global_steps
            signals = engine_signals(self.engine)
            if lrs is not None:
                signals["lrs"] = lrs
            if self.monitor.end_step(step, **signals):
                if self.halt_checkpoint_dir is not None:
                    self.engine.save_checkpoint(self.halt_checkpoint_dir, tag=f"lossguard-halt-step{step}")
                raise LossguardHalt(step, self.monitor.halted_at, self.halt_checkpoint_dir)
        return result

    def detach(self) -> None:
        """Unwrap the engine and finish the events file; after a halt with `exit_code_on_halt`, exit."""
        self._hook.remove()
        self.engine.backward, self.engine.step = self._orig_backward, self._orig_step
        self.monitor.close()
        exit_after_halt(self.monitor)


def attach(engine: Any, *, halt_checkpoint_dir: str | None = None, **options: Any) -> Attachment:
    """Guard a DeepSpeed engine in place. Options: see `GuardOptions` (events_dir, halt_on, ...)."""
    guard_options = GuardOptions(**options)
    refuse_recover(guard_options, "lossguard.attach")
    return Attachment(engine, guard_options, halt_checkpoint_dir)
