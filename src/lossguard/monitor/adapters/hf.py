"""`LossguardCallback`: the live guard inside `transformers.Trainer`.

The numbers it records are the Trainer's own (what it logs at `logging_steps=1`):

- the loss: a forward hook on the model reads each micro-batch's raw loss (before the Trainer's NaN
  filter) and labels; with `num_items_in_batch` it is normalised by the token count the Trainer divided
  the model's loss by (see `tensors.loss_items`);
- grad_norm: the norm before clipping, which the Trainer gets back from `accelerator.clip_grad_norm_`
  (wrapped on the Trainer's accelerator instance for the run); under DeepSpeed the engine's
  `get_global_grad_norm()`, as the Trainer logs it;
- the LRs: read in `on_optimizer_step`, after the optimizer step and before `lr_scheduler.step()`, where
  the Trainer reads the LR it logs for the step: the LR that step used.

`on_step_end` closes the optimizer step. Under DeepSpeed the engine (found once, at train start) also
supplies skipped steps and the loss scale. A halt sets `should_save` and `should_training_stop`, which
every rank does at the same step, so the Trainer writes a checkpoint and stops everywhere.
"""

from __future__ import annotations

import gc
import sys
from typing import Any

from transformers import TrainerCallback

from lossguard.monitor import tensors
from lossguard.monitor.adapters import hf_gate
from lossguard.monitor.adapters.deepspeed import engine_facts, engine_signals
from lossguard.monitor.core import Monitor
from lossguard.monitor.guard import exit_after_halt
from lossguard.monitor.options import GuardOptions


class LossguardCallback(TrainerCallback):
    def __init__(self, **options: Any) -> None:
        self.options = GuardOptions(**options)
        self.monitor: Monitor | None = None
        self.gate: Any = None  # recover: DeepSpeedGate under DeepSpeed, TrainerGate otherwise (hf_gate.py)
        self.engine: Any = None
        self._hook = None
        self._skipped = 0
        self._grad_norm: Any = None  # this step's norm before clipping (device tensor)
        self._lrs: list[float] | None = None  # the LRs this step used
        self._shifts_labels = True  # how the Trainer counts `num_items_in_batch` (tensors.loss_items)
        self._accelerator: Any = None  # whose `clip_grad_norm_` is wrapped for the run

    # -- Trainer events --------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        self.engine = find_deepspeed_engine(model)
        facts = _trainer_facts(args)
        if self.engine is not None:
            facts.update(engine_facts(self.engine))
        self.monitor = Monitor(self.options, model, optimizer=optimizer, facts=facts, entry="hf")
        self._hook = tensors.unwrap_model(model).register_forward_hook(self._forward, with_kwargs=True)
        trainer = find_trainer()
        if trainer is not None:
            # transformers >= 5 counts num_items_in_batch over labels[..., 1:] where the model's loss shifts
            # them; 4.46-4.x counted every label (the attribute did not exist yet)
            self._shifts_labels = bool(getattr(trainer, "_loss_shifts_labels", False))
            self._accelerator = _wrap_clip_grad_norm(getattr(trainer, "accelerator", None), self)
        if self.monitor.gate is not None:
            self.gate = hf_gate.start(self, args, state, trainer)

    def on_pre_optimizer_step(self, args, state, control, model=None, optimizer=None, **kwargs):
        if self.engine is None and self._grad_norm is None and self.monitor is not None \
                and not self.monitor.disabled and not self.monitor.sharded:  # FSDP: the monitor folds it
            # The Trainer computed no norm through its accelerator (a path that bypasses it): the norm of
            # the gradients still in .grad here, after any clipping (device op, no sync).
            self._grad_norm = tensors.grad_norm(p for p in model.parameters() if p.requires_grad)
        if isinstance(self.gate, hf_gate.TrainerGate):
            self.gate.before_step(state, optimizer, kwargs.get("lr_scheduler"))

    def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        # After optimizer.step(), before lr_scheduler.step(): where the Trainer reads the LR it logs for this
        # step (transformers 5 `_inner_training_loop`). Python floats: no device read.
        self._lrs = _param_group_lrs(optimizer)

    def on_step_end(self, args, state, control, optimizer=None, **kwargs):
        if self.monitor is None:
            return control
        if self.gate is not None:  # the step ended at the gate, before it was applied
            self._grad_norm, self._lrs = None, None
            if hf_gate.end(self.gate):
                control.should_save = True
                control.should_training_stop = True
            return control
        if self.engine is not None:
            signals = engine_signals(self.engine)
        else:
            self._skipped += int(bool(getattr(optimizer, "step_was_skipped", False)))
            signals = {"grad_norm": self._grad_norm, "skipped_steps": self._skipped,
                       "lrs": _param_group_lrs(optimizer)}
        if self._lrs is not None:
            signals["lrs"] = self._lrs
        self._grad_norm, self._lrs = None, None
        if self.monitor.end_step(state.global_step, **signals):
            control.should_save = True
            control.should_training_stop = True
        return control

    def on_train_end(self, args, state, control, **kwargs):
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        _unwrap_clip_grad_norm(self._accelerator)
        self._accelerator = None
        hf_gate.stop(self.gate)
        if self.monitor is not None:
            self.monitor.close()
        exit_after_halt(self.monitor)  # the halt's checkpoint is saved and the loop has returned

    # -- hooks -----------------------------------------------------------------------------------
    def _forward(self, module, args, kwargs, output):
        if not module.training or self.monitor is None or getattr(getattr(self.gate, "capture", None), "off", False):
            return  # (a replay's or its scan's forward: the step was measured on its first attempt)
        num_items = kwargs.get("num_items_in_batch")
        items = tensors.loss_items(kwargs, self._shifts_labels) if num_items is not None else None
        self.monitor.observe_micro(loss=tensors.output_loss(output), labels=tensors.find_labels(args, kwargs),
                                   num_items=num_items, loss_items=items)

    def _record_grad_norm(self, norm: Any) -> None:
        if self.monitor is not None and not self.monitor.disabled:
            self._grad_norm = norm


def find_trainer() -> Any:
    """The `transformers.Trainer` whose training loop is calling this callback: one look up the call
    stack at train start (the callback handler is called from the Trainer's own methods), never per step.
    None when no Trainer is on the stack (a callback driven by other code)."""
    from transformers import Trainer

    frame = sys._getframe(1)
    for _ in range(32):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if isinstance(owner, Trainer):
            return owner
        frame = frame.f_back
    return None


def _wrap_clip_grad_norm(accelerator: Any, callback: LossguardCallback) -> Any:
    """Record the norm `accelerator.clip_grad_norm_` returns (the one before clipping, which the Trainer
    logs as grad_norm), by shadowing the method on this accelerator instance for the run; the class and
    every other accelerator are untouched. The accelerator, or None where it has no such method."""
    original = getattr(accelerator, "clip_grad_norm_", None)
    if original is None:
        return None

    def clip_grad_norm_(*args, **kwargs):
        norm = original(*args, **kwargs)
        callback._record_grad_norm(norm)  # an attribute store: nothing here can fail the user's step
        return norm

    clip_grad_norm_.lossguard_original = original
    accelerator.clip_grad_norm_ = clip_grad_norm_
    return accelerator


def _unwrap_clip_grad_norm(accelerator: Any) -> None:
    if accelerator is None:
        return
    wrapper = accelerator.__dict__.get("clip_grad_norm_")
    original = getattr(wrapper, "lossguard_original", None)
    if original is None:
        return
    if getattr(original, "__self__", None) is accelerator and original.__func__ is \
            getattr(type(accelerator), "clip_grad_norm_", None):
        del accelerator.clip_grad_norm_  # the class's own method again
    else:
        accelerator.clip_grad_norm_ = original  # another wrapper was there first: put it back


def _param_group_lrs(optimizer: Any) -> list[float] | None:
    try:
        return [float(g["lr"]) for g in optimizer.param_groups] if optimizer is not None else None
    except Exception:
        return None


def find_deepspeed_engine(model: Any) -> Any:
    """The DeepSpeedEngine wrapping `model`, if any. The Trainer hands callbacks the bare model; the
    engine is the object whose `module` it is. One heap walk at train start, never per step."""
    try:
        from deepspeed import DeepSpeedEngine
    except Exception:
        return None
    for holder in gc.get_referrers(model):
        if isinstance(holder, dict):
            for owner in gc.get_referrers(holder):
                if isinstance(owner, DeepSpeedEngine) and owner.module is model:
                    return owner
    return None


def _trainer_facts(args: Any) -> dict[str, Any]:
    import transformers

    facts: dict[str, Any] = {"transformers_version": transformers.__version__,
                             "gradient_accumulation_steps": args.gradient_accumulation_steps,
                             "gradient_checkpointing": bool(args.gradient_checkpointing),
                             "bf16": bool(args.bf16), "fp16": bool(args.fp16), "entry_point": "hf"}
    try:
        import torch

        facts["torch_version"] = torch.__version__
    except Exception:
        pass
    return facts
