"""Two-rank raw DeepSpeed engine jobs (CPU, gloo) with `lossguard.attach(engine, recover=...)`.

    torchrun --nproc_per_node 2 ds_recover_job.py OUT_DIR SCENARIO [SCENARIO ...]

Scenario names: zSTAGE-CASE[-bf16], CASE one of
  nan_once     rank 1's loss is NaN at step NAN_STEP (recover=True): the step is held on both ranks;
  masked       rank 1's labels are all -100 at step NAN_STEP (recover=True): held;
  over_budget  rank 1's loss is NaN at steps 3, 4, 5 with a budget of 2: halts at 5 with a checkpoint;
  healthy      recover=True, no fault;
  plain        the same healthy run without lossguard.
Every rank writes OUT_DIR/SCENARIO/rank{r}.json (its losses, the held steps, the halt, the engine's counters)
and, at the faulty step, its own shard of the state right before and right after `engine.step()`
(before-rank{r}.pt, after-rank{r}.pt: parameters or ZeRO-3 partitions, the optimizer's state dict, the LR
scheduler, the engine's counters); rank 0 also writes summary.json (its findings).
"""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import tiny  # noqa: E402

STEPS, NAN_STEP = 8, 4
POISON = {"nan_once": {NAN_STEP}, "masked": {NAN_STEP}, "over_budget": {3, 4, 5}, "healthy": set(), "plain": set()}


def shard_state(engine) -> dict:
    """This rank's own state, cloned: what a held step must leave bit for bit as it was."""
    params = [(p.ds_tensor if hasattr(p, "ds_tensor") else p).detach().clone() for p in engine.module.parameters()]
    scheduler = engine.lr_scheduler.state_dict() if engine.lr_scheduler is not None else None
    return {"params": params, "optimizer": _plain(engine.optimizer.state_dict()), "scheduler": _plain(scheduler),
            "counters": [engine.global_steps, engine.global_samples, engine.skipped_steps]}


def _plain(value):
    """Tensors (cloned), numbers, strings and the containers of them; anything else by its type name."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (int, float, str, bool)):
        return value
    return {key: _plain(v) for key, v in vars(value).items()} if hasattr(value, "__dict__") else type(value).__name__


def run(out_dir: str, name: str) -> None:
    import deepspeed

    import lossguard

    stage, case, bf16 = int(name[1]), name[3:].removesuffix("-bf16"), name.endswith("-bf16")
    rank = tiny.rank()
    work = os.path.join(out_dir, name)
    os.makedirs(work, exist_ok=True)
    config = tiny.ds_config(stage, bf16=bf16, **({"check_grad_overflow": False} if bf16 else {}))
    model = tiny.tiny_gpt2()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    guard = None
    if case != "plain":
        recover = lossguard.RecoverOptions(budget=2, window=100) if case == "over_budget" else True
        guard = lossguard.attach(engine, events_dir=os.path.join(work, "events"), halt_on="error", recover=recover,
                                 halt_checkpoint_dir=os.path.join(work, "ckpt"), fingerprint_every=1)
    data = tiny.Tokens()
    micro = config["train_micro_batch_size_per_gpu"]
    losses, held, halted = [], [], None
    try:
        for step in range(1, STEPS + 1):
            start = (rank * micro + (step - 1) * micro * 2) % len(data)
            batch = data.ids[start:start + micro]
            labels = batch.clone()
            poisoned = rank == 1 and step in POISON[case]
            if poisoned and case == "masked":
                labels[:] = -100
            loss = engine(input_ids=batch, labels=labels).loss
            if poisoned and case != "masked":
                loss = loss * float("nan")
            losses.append(float(loss))
            engine.backward(loss)
            if step == NAN_STEP and case in ("nan_once", "masked"):
                torch.save(shard_state(engine), os.path.join(work, f"before-rank{rank}.pt"))
            engine.step()
            if step == NAN_STEP and case in ("nan_once", "masked"):
                torch.save(shard_state(engine), os.path.join(work, f"after-rank{rank}.pt"))
            held.append(guard is not None and guard.monitor.held is not None)
    except lossguard.LossguardHalt as halt:
        halted = halt.step
    if guard is not None:
        guard.detach()
    with open(os.path.join(work, f"rank{rank}.json"), "w") as fh:
        json.dump({"losses": losses, "held": held, "halted_at": halted, "global_steps": engine.global_steps,
                   "skipped_steps": engine.skipped_steps}, fh)
    if rank == 0:
        findings = [f.to_dict() for f in guard.monitor._emitted] if guard is not None else []
        with open(os.path.join(work, "summary.json"), "w") as fh:
            json.dump({"scenario": name, "halted_at": halted, "findings": findings}, fh, default=str)
    engine.destroy() if hasattr(engine, "destroy") else None


if __name__ == "__main__":
    tiny.run_scenarios(run)
