"""Two-rank raw DeepSpeed engine jobs with one fault (or none), guarded by `lossguard.attach`.

    torchrun --nproc_per_node 2 ds_job.py OUT_DIR SCENARIO [SCENARIO ...]

Scenario names: STAGE-FAULT, e.g. z2-nan-bf16. On a halt every rank saves a checkpoint under
OUT_DIR/SCENARIO/ckpt and leaves the loop through LossguardHalt. A name ending in `-sum` runs the same
fault on the summary path (`detail_every_step_up_to=0`: the real all_reduce each step, a gather only when
the summary shows something) with fingerprints at steps 1 and 5 only, so most steps are summary-only.
"""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import tiny  # noqa: E402

FAULT_STEP = 4
NUM_STEPS = 8


def run(out_dir: str, name: str) -> None:
    import deepspeed

    import lossguard

    stage = int(name[1])
    fault = name[3:].removesuffix("-sum")
    summary_path = name.endswith("-sum")
    rank = tiny.rank()
    kw: dict = {}
    ga = 2 if fault == "healthy-ga" else 1
    if fault.startswith("nan-bf16"):
        kw.update(bf16=True, check_grad_overflow=False)
    if fault in ("fp16-storm", "healthy-fp16"):
        kw.update(fp16=True, initial_scale_power=32 if fault == "healthy-fp16" else 16)
    model = tiny.tiny_gpt2()
    if fault in ("lora-reentrant", "healthy-lora"):
        from peft import LoraConfig, get_peft_model

        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
        model.config.use_cache = False
        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"],
                                                 modules_to_save=["ln_f"], lora_dropout=0.0))
        if fault == "lora-reentrant":
            model.get_input_embeddings()._forward_hooks.clear()  # nothing makes the inputs require grad
    config = tiny.ds_config(stage, ga=ga, **kw)
    params = [p for p in model.parameters() if p.requires_grad]
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, config=config)
    if fault == "late-module":  # a module added after the optimizer was built
        inner = engine.module
        inner.late = torch.nn.Linear(32, 32).to(next(inner.parameters()).dtype)
        inner.transformer.ln_f.register_forward_hook(lambda m, a, out: out + inner.late(out))
    if fault == "fp16-storm":
        def blow_up(module, args, output):
            if engine.global_steps + 1 >= FAULT_STEP:
                return (output[0] * 1e6, *output[1:]) if isinstance(output, tuple) else output * 1e6
            return None

        engine.module.transformer.h[0].register_forward_hook(blow_up)

    work = os.path.join(out_dir, name)
    ckpt = os.path.join(work, "ckpt")
    if fault == "nan-bf16-disk-full" and rank == 1:
        # This rank's events file is /dev/full: every write fails with ENOSPC, as on a node whose disk filled.
        os.makedirs(os.path.join(work, "events"), exist_ok=True)
        os.symlink("/dev/full", os.path.join(work, "events", "events-rank1.jsonl"))
    gathers = _count_gathered_parameters() if fault == "healthy-count-gathers" else None
    paths = {"detail_every_step_up_to": 0, "fingerprint_every": FAULT_STEP + 1} if summary_path else \
        {"fingerprint_every": 1}
    if fault == "nan-bf16-snapshot-fails":
        # The snapshot is the rank-local work after the halt decision when the NEXT step is a fingerprint step
        # and this one is not (with prints every step the ratios' own sample is kept as the snapshot instead).
        paths["fingerprint_every"] = FAULT_STEP + 1
    guard = lossguard.attach(engine, events_dir=os.path.join(work, "events"), halt_on="warning",
                             halt_checkpoint_dir=ckpt, detectors=None, **paths)
    current = {"step": 0}
    if fault == "nan-bf16-snapshot-fails" and rank == 1:
        # rank 1's work after the halt decision (the next step's parameter snapshot) raises at the fault step
        fail_snapshot_at(guard.monitor.updates, FAULT_STEP, current)
    data = tiny.Tokens()
    micro = config["train_micro_batch_size_per_gpu"]
    halted = None
    cursor = rank * micro
    try:
        for step in range(1, NUM_STEPS + 1):
            current["step"] = step
            for _ in range(ga):
                batch = data.ids[cursor % len(data): cursor % len(data) + micro]
                cursor += micro * 2
                labels = batch.clone()
                if fault == "masked-one-rank" and rank == 1 and step >= FAULT_STEP:
                    labels[:] = -100
                out = engine(input_ids=batch, labels=labels)
                loss = out.loss
                if fault.startswith("nan-bf16") and rank == 1 and step == FAULT_STEP:
                    loss = loss * float("inf")
                engine.backward(loss)
                engine.step()
            if fault == "desync" and rank == 1 and step == FAULT_STEP:
                with torch.no_grad():
                    next(engine.module.parameters()).add_(1e-2)  # this rank's replica drifts
                # caught at the next step's fingerprint
    except lossguard.LossguardHalt as halt:
        halted = halt.step
    guard.detach()
    with open(os.path.join(work, f"rank{rank}.json"), "w") as fh:  # what each rank decided, for agreement
        json.dump({"halted_at": halted, "global_step": engine.global_steps, "disabled": guard.monitor.disabled,
                   "gathered_parameters_calls": gathers[0] if gathers else None,
                   "steps_by_path": guard.monitor.steps_by_path}, fh)
    if rank == 0:
        findings = [f.to_dict() for f in guard.monitor._emitted]
        with open(os.path.join(work, "summary.json"), "w") as fh:
            json.dump({"scenario": name, "halted_at": halted, "global_step": engine.global_steps,
                       "disabled": guard.monitor.disabled, "checkpoint": ckpt if halted else None,
                       "findings": findings}, fh, default=str)
    engine.destroy() if hasattr(engine, "destroy") else None


def fail_snapshot_at(updates, fault_step: int, current: dict) -> None:
    """The monitor's update sampler raises (as out of memory would) when it snapshots at `fault_step`."""
    snapshot = updates.snapshot

    def failing_snapshot():
        if current["step"] == fault_step:
            raise MemoryError("injected snapshot failure (test hook)")
        return snapshot()

    updates.snapshot = failing_snapshot


def _count_gathered_parameters() -> list[int]:
    """Count every `deepspeed.zero.GatheredParameters` context entered from now on (DeepSpeed's own
    training step does not use it; a monitor that gathered parameters for a print would)."""
    import deepspeed

    count = [0]
    enter = deepspeed.zero.GatheredParameters.__enter__

    def counting_enter(self):
        count[0] += 1
        return enter(self)

    deepspeed.zero.GatheredParameters.__enter__ = counting_enter
    return count


if __name__ == "__main__":
    tiny.run_scenarios(run)
