"""Two-rank Trainer + DeepSpeed job with one fault (or none), guarded by LossguardCallback.

    torchrun --nproc_per_node 2 hf_job.py OUT_DIR SCENARIO [SCENARIO ...]

Each scenario runs a fresh Trainer in the same process group and writes OUT_DIR/SCENARIO/. A name ending
in `-sum` runs the same scenario on the summary path (`detail_every_step_up_to=0`: the real all_reduce each
step, a gather only when the summary shows something) with fingerprints at steps 1 and 5 only.
"""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import tiny  # noqa: E402

FAULT_STEP = 4


class Faults:
    """Mutable fault switches the model's forward and the collator read."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.micro = 0  # micro-batches seen on this rank
        self.step = 0


def build(name: str):
    from transformers import GPT2LMHeadModel

    kw: dict = {"stage": 2}
    args_kw: dict = {}
    model = tiny.tiny_gpt2()
    faults = Faults(name)

    callback_kw: dict = {"halt_on": "warning", "fingerprint_every": 1, "detectors": None}

    if name == "healthy-z1":
        kw["stage"] = 1
    elif name == "healthy-z3":
        kw["stage"] = 3
    elif name == "healthy-ga":
        args_kw["gradient_accumulation_steps"] = 2
    elif name == "healthy-fp16":  # starts at scale 2^32: DeepSpeed calibrates it down with skips
        args_kw["fp16"] = True
        kw.update(fp16=True, initial_scale_power=32)
    elif name == "nan-bf16":
        args_kw["bf16"] = True
        kw.update(bf16=True, check_grad_overflow=False)
    elif name == "fp16-storm":
        args_kw["fp16"] = True
        kw["fp16"] = True
    elif name in ("lora-reentrant", "healthy-lora"):
        from peft import LoraConfig, get_peft_model

        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": name == "lora-reentrant"})
        model.config.use_cache = False
        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"],
                                                 modules_to_save=["ln_f"], lora_dropout=0.0))
        if name == "lora-reentrant":
            # transformers >= 5 and peft turn input grads on; older stacks and custom models did not
            model.get_input_embeddings()._forward_hooks.clear()
    del GPT2LMHeadModel
    return model, kw, args_kw, faults, callback_kw


def install_faults(model, faults: Faults):
    rank = tiny.rank()

    def pre(module, args, kwargs):
        if not module.training:
            return None
        faults.micro += 1
        if faults.name == "masked-one-rank" and rank == 1 and faults.step + 1 >= FAULT_STEP:
            kwargs["labels"] = torch.full_like(kwargs["labels"], -100)
            return args, kwargs
        return None

    def post(module, args, kwargs, output):
        if not module.training:
            return None
        if faults.name == "nan-bf16" and rank == 1 and faults.step + 1 == FAULT_STEP:
            output.loss = output.loss * float("inf")
        return output

    def blow_up(module, args, output):  # activations past fp16's 65504 from the fault step on
        if module.training and faults.step + 1 >= FAULT_STEP:
            return (output[0] * 1e6, *output[1:]) if isinstance(output, tuple) else output * 1e6
        return None

    if faults.name == "fp16-storm":
        model.transformer.h[0].register_forward_hook(blow_up)

    model.register_forward_pre_hook(pre, with_kwargs=True, prepend=True)
    model.register_forward_hook(post, with_kwargs=True, prepend=True)


def fail_collection_at(updates, fault_step: int, faults: Faults) -> None:
    """The monitor's update sampler raises once while collecting `fault_step`'s signals (a lossguard bug)."""
    ratios = updates.ratios

    def failing_ratios():
        if faults.step == fault_step:
            raise RuntimeError("injected internal error (test hook)")
        return ratios()

    updates.ratios = failing_ratios


def run(out_dir: str, name: str) -> None:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from lossguard import LossguardCallback

    work = os.path.join(out_dir, name)
    model, kw, args_kw, faults, callback_kw = build(name.removesuffix("-sum"))
    if name.endswith("-sum"):
        callback_kw.update(detail_every_step_up_to=0, fingerprint_every=FAULT_STEP + 1)
    name = faults.name
    install_faults(model, faults)

    class StepCounter(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **k):
            faults.step = state.global_step
            if name == "internal-error" and state.global_step == 1 and tiny.rank() == 1:
                fail_collection_at(guard.monitor.updates, FAULT_STEP, faults)
            if name == "desync" and state.global_step == FAULT_STEP - 1 and tiny.rank() == 1:
                with torch.no_grad():
                    next(model.parameters()).add_(1e-2)  # one rank's replica drifts

        def on_train_begin(self, args, state, control, model=None, **k):
            if name == "late-module":  # created after the Trainer built the optimizer and engine
                model.late = torch.nn.Linear(32, 32)
                model.transformer.ln_f.register_forward_hook(lambda m, a, out: out + model.late(out))

    args = TrainingArguments(
        output_dir=os.path.join(work, "out"), per_device_train_batch_size=4, max_steps=8,
        learning_rate=1e-3, logging_steps=1, save_strategy="no", report_to=[], seed=0,
        deepspeed=tiny.hf_ds_config(**kw), use_cpu=True, disable_tqdm=True, dataloader_num_workers=0,
        save_only_model=False, **args_kw,
    )
    guard = LossguardCallback(events_dir=os.path.join(work, "events"), **callback_kw)
    trainer = Trainer(model=model, args=args, train_dataset=tiny.Tokens(), callbacks=[StepCounter(), guard])
    trainer.train()
    summary = {
        "scenario": name,
        "halted_at": guard.monitor.halted_at if guard.monitor else None,
        "disabled": guard.monitor.disabled if guard.monitor else None,
        "global_step": trainer.state.global_step,
        "findings": [f.to_dict() for f in guard.monitor._emitted] if guard.monitor else [],
        "steps_by_path": guard.monitor.steps_by_path if guard.monitor else None,
    }
    if tiny.rank() == 0:
        with open(os.path.join(work, "summary.json"), "w") as fh:
            json.dump(summary, fh, default=str)
    tiny.reset_accelerate()


if __name__ == "__main__":
    tiny.run_scenarios(run)
