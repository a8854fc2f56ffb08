"""`LossguardCallback`: the live guard inside `transformers.Trainer`.

A forward hook on the model reads each micro-batch's raw loss (before the Trainer's NaN filter) and
labels; `on_step_end` closes the optimizer step. Under DeepSpeed the engine (found once, at train
start) supplies grad_norm, skipped steps, loss scale and LRs. A halt sets `should_save` and
`should_training_stop`, which every rank does at the same step, so the Trainer writes a checkpoint
and stops everywhere.
"""

from __future__ import annotations

import gc
from typing import Any

from transformers import TrainerCallback

from lossguard.monitor import tensors
from lossguard.monitor.adapters.deepspeed import engine_facts, engine_signals
from lossguard.monitor.core import Monitor
from lossguard.monitor.guard import exit_after_halt
from lossguard.monitor.options import GuardOptions


class LossguardCallback(TrainerCallback):
    def __init__(self, **options: Any) -> None:
        self.options = GuardOptions(**options)
        self.monitor: Monitor | None = None
        self.engine: Any = None
        self._hook = None
        self._skipped = 0

    # -- Trainer events --------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        self.engine = find_deepspeed_engine(model)
        facts = _trainer_facts(args)
        if self.engine is not None:
            facts.update(engine_facts(self.engine))
        self.monitor = Monitor(self.options, model, optimizer=optimizer, facts=facts, entry="hf")
        self._hook = tensors.unwrap_model(model).register_forward_hook(self._forward, with_kwargs=True)

    def on_pre_optimizer_step(self, args, state, control, model=None, optimizer=None, **kwargs):
        if self.engine is None and self.monitor is not None and not self.monitor.disabled:
            # without DeepSpeed the gradients are still in .grad here (device op, no sync)
            self._grad_norm = tensors.grad_norm(p for p in model.parameters() if p.requires_grad)

    def on_step_end(self, args, state, control, optimizer=None, **kwargs):
        if self.monitor is None:
            return control
        if self.engine is not None:
            signals = engine_signals(self.engine)
        else:
            self._skipped += int(bool(getattr(optimizer, "step_was_skipped", False)))
            signals = {"grad_norm": getattr(self, "_grad_norm", None), "skipped_steps": self._skipped,
                       "lrs": [float(g["lr"]) for g in optimizer.param_groups] if optimizer is not None else None}
        if self.monitor.end_step(state.global_step, **signals):
            control.should_save = True
            control.should_training_stop = True
        return control

    def on_train_end(self, args, state, control, **kwargs):
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self.monitor is not None:
            self.monitor.close()
        exit_after_halt(self.monitor)  # the halt's checkpoint is saved and the loop has returned

    # -- hooks -----------------------------------------------------------------------------------
    def _forward(self, module, args, kwargs, output):
        if not module.training or self.monitor is None:
            return
        self.monitor.observe_micro(loss=tensors.output_loss(output), labels=tensors.find_labels(args, kwargs),
                                   num_items=kwargs.get("num_items_in_batch"))


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
