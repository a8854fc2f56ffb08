"""Two-rank `transformers.Trainer` jobs (CPU, gloo) with `LossguardCallback(recover=...)`.

    torchrun --nproc_per_node 2 hf_recover_job.py OUT_DIR SCENARIO [SCENARIO ...]

Scenario names: STACK-CASE, STACK one of ddp (no DeepSpeed), z1, z2, z3 (DeepSpeed ZeRO stage); CASE one of
  nan_once     rank 1's loss is NaN at step NAN_STEP (replay off): the step is held on both ranks;
  masked       rank 1's labels are all -100 at step NAN_STEP (recover=True): quarantined without a replay;
  over_budget  rank 1's loss is NaN at steps 3, 4, 5 with a budget of 2 (replay off): the Trainer saves and
               stops at 5;
  transient    rank 1's loss is NaN on the first attempt of step NAN_STEP (recover=True, DeepSpeed): the replay
               through the Trainer's own training_step is clean;
  rollback     (DeepSpeed) snapshots every 2 steps; NaN written into rank 1's fp32 master partition after step
               5: the loss at 7 is held and every rank rolls back to the snapshot taken before step 5;
  poison       (DeepSpeed) 32 samples, 12 steps (three epochs); sample POISON_INDEX carries token POISON, whose
               embedding row is 1e38: named and quarantined the first time, left out of every later epoch;
  replay_oom   as `transient`, but the replay's forward raises on rank 1 only (an out-of-memory error inside
               the model): every rank holds the step, none enters the backward alone; run alone with a short
               process-group timeout (LOSSGUARD_TEST_PG_TIMEOUT_S), so that a hang fails fast;
  healthy      recover=True, no fault;
  plain        the same healthy run without lossguard.
Every rank writes OUT_DIR/SCENARIO/rank{r}.json (the losses its model computed, the Trainer's final step) and,
in nan_once, its own shard of the state as the held step began and as the next one began (before-rank{r}.pt,
after-rank{r}.pt); rank 0 also writes summary.json (the Trainer's logged losses, its findings), the Trainer's
state (out/trainer_state.json, as a checkpoint holds it) and prints MARK lines around the Trainer's stdout.
"""

from __future__ import annotations

import datetime
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import tiny  # noqa: E402
from ds_recover_job import POISON, master_partition, model_for, shard_state  # noqa: E402

NAN_STEP, POISON_INDEX = 4, 13
MARK = "==== hf_recover_job scenario"
NAN_AT = {"nan_once": {NAN_STEP}, "over_budget": {3, 4, 5}, "transient": {NAN_STEP}, "replay_oom": {NAN_STEP}}


class Data(tiny.Tokens):
    """`tiny.Tokens`; in `poison`, 32 samples and sample POISON_INDEX carries the extra token."""

    def __init__(self, case: str) -> None:
        super().__init__(n=32 if case == "poison" else 256)
        if case == "poison":
            self.ids[POISON_INDEX, 5] = POISON


def trainer_state(trainer) -> dict:
    """Without DeepSpeed: the model, the optimizer and the scheduler, cloned."""
    from ds_recover_job import _plain

    return {"params": [p.detach().clone() for p in trainer.model.parameters()],
            "optimizer": _plain(trainer.optimizer.state_dict()), "scheduler": _plain(trainer.lr_scheduler.state_dict()),
            "counters": []}


def run(out_dir: str, name: str) -> None:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    import lossguard
    from lossguard.monitor.adapters.hf import find_deepspeed_engine

    stack, case = name.split("-", 1)
    seconds = os.environ.get("LOSSGUARD_TEST_PG_TIMEOUT_S")  # a test that must fail fast on a hang
    if seconds and not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo", timeout=datetime.timedelta(seconds=int(seconds)))
    counted = tiny.count_collectives()  # every rank must make the same collectives: counted from here
    rank = tiny.rank()
    work = os.path.join(out_dir, name)
    os.makedirs(work, exist_ok=True)
    model = model_for(case)
    losses: dict[int, float] = {}  # each step's first attempt
    now = {"step": 0, "fired": 0, "seen": 0}

    def poison(module, args, kwargs, output):  # registered first: the callback's hook sees the poisoned loss
        if module.training:
            step = now["step"] + 1
            if rank == 1 and step in NAN_AT.get(case, ()) and now["fired"] != step:
                now["fired"] = step  # the first attempt only: a replay runs clean
                output.loss = output.loss * float("nan")
            now["seen"] += int((kwargs["input_ids"] == POISON).any())
            losses.setdefault(step, float(output.loss.detach()))
        return output

    model.register_forward_hook(poison, with_kwargs=True)

    def mask(module, args, kwargs):  # `masked`: rank 1's micro-batch at NAN_STEP has no supervised token
        if module.training and case == "masked" and rank == 1 and now["step"] + 1 == NAN_STEP:
            return args, {**kwargs, "labels": torch.full_like(kwargs["labels"], -100)}
        return None

    model.register_forward_pre_hook(mask, with_kwargs=True)

    def oom(module, args):  # `replay_oom`: the forward after the poisoned first attempt (the replay) raises
        if module.training and case == "replay_oom" and now["fired"] == NAN_STEP and not now.get("oom"):
            now["oom"] = 1
            raise RuntimeError("out of memory (simulated, replay_oom)")

    model.register_forward_pre_hook(oom)
    trainer_box: dict = {}

    class Probe(TrainerCallback):
        def on_train_end(self, args, state, control, model=None, **kwargs):
            engine = find_deepspeed_engine(model)
            params = shard_state(engine)["params"] if engine is not None else trainer_state(trainer_box["trainer"])["params"]
            torch.save(params, os.path.join(work, f"final-rank{rank}.pt"))

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if case == "rollback" and state.global_step == 5 and rank == 1:
                with torch.no_grad():
                    master_partition(find_deepspeed_engine(model))[0] = float("nan")

        def on_step_begin(self, args, state, control, model=None, **kwargs):
            now["step"] = state.global_step
            if case == "nan_once" and state.global_step in (NAN_STEP - 1, NAN_STEP):
                engine = find_deepspeed_engine(model)
                trainer = trainer_box["trainer"]
                snap = shard_state(engine) if engine is not None else trainer_state(trainer)
                snap["trainer_scheduler"] = trainer.lr_scheduler.state_dict()  # the one the Trainer steps
                when = "before" if state.global_step == NAN_STEP - 1 else "after"
                torch.save(snap, os.path.join(work, f"{when}-rank{rank}.pt"))

    callbacks = [Probe()]
    guard = None
    if case != "plain":
        recover = True
        if case == "rollback":
            recover = lossguard.RecoverOptions(snapshot_every=2)
        if case in ("nan_once", "over_budget"):  # hold only
            recover = lossguard.RecoverOptions(budget=2 if case == "over_budget" else 3, window=100, replay=False)
        guard = lossguard.LossguardCallback(events_dir=os.path.join(work, "events"), halt_on="error",
                                            recover=recover, fingerprint_every=1)
        callbacks.append(guard)
    deepspeed = tiny.hf_ds_config(int(stack[1])) if stack != "ddp" else None
    if deepspeed is None:  # a DeepSpeed scenario before this one left accelerate's switch on
        os.environ.pop("ACCELERATE_USE_DEEPSPEED", None)
    args = TrainingArguments(
        output_dir=os.path.join(work, "out"), per_device_train_batch_size=4, max_steps=12 if case == "poison" else 8,
        learning_rate=1e-3,
        logging_steps=1, save_strategy="no", report_to=[], seed=0, deepspeed=deepspeed, use_cpu=True,
        disable_tqdm=True, dataloader_num_workers=0, max_grad_norm=1.0)
    trainer = Trainer(model=model, args=args, train_dataset=Data(case), callbacks=callbacks)
    trainer_box["trainer"] = trainer
    if rank == 0:  # the Trainer's own stdout of this scenario lies between the markers (stdout.log)
        print(f"{MARK} begin {name}", flush=True)
    trainer.train()
    if rank == 0:
        print(f"{MARK} end {name}", flush=True)
        os.makedirs(os.path.join(work, "out"), exist_ok=True)
        trainer.state.save_to_json(os.path.join(work, "out", "trainer_state.json"))  # as a save writes it
    with open(os.path.join(work, f"rank{rank}.json"), "w") as fh:
        json.dump({"losses": [losses[s] for s in sorted(losses)], "global_step": trainer.state.global_step,
                   "halted_at": guard.monitor.halted_at if guard else None, "seen_poison": now["seen"],
                   "collectives": tiny.collectives_since(counted)}, fh)
    if rank == 0:
        logged = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        findings = [f.to_dict() for f in guard.monitor._emitted] if guard else []
        with open(os.path.join(work, "summary.json"), "w") as fh:
            json.dump({"scenario": name, "logged": logged, "findings": findings,
                       "checkpoints": sorted(os.listdir(os.path.join(work, "out"))) if os.path.isdir(
                           os.path.join(work, "out")) else []}, fh, default=str)
    tiny.reset_accelerate()


if __name__ == "__main__":
    tiny.run_scenarios(run)
