"""Two-rank raw DeepSpeed engine jobs (CPU, gloo) with `lossguard.attach(engine, recover=...)`.

    torchrun --nproc_per_node 2 ds_recover_job.py OUT_DIR SCENARIO [SCENARIO ...]

Scenario names: zSTAGE-CASE[-bf16|-fp16], CASE one of
  nan_once     rank 1's loss is NaN at step NAN_STEP (replay off): the step is held on both ranks;
  masked       rank 1's labels are all -100 at step NAN_STEP (recover=True): quarantined without a replay;
  over_budget  rank 1's loss is NaN at steps 3, 4, 5 with a budget of 2 (replay off): halts at 5 with a
               checkpoint;
  transient    rank 1's loss is NaN on the first attempt of step NAN_STEP (recover=True): the replay is clean;
  flaky        the same at steps 3 and 6: rank 1 is named a suspect device at 6;
  replay_oom   as `transient`, but the replay's forward raises on rank 1 only (an out-of-memory error inside
               the model): every rank holds the step, none enters the backward alone; run alone with a
               short process-group timeout (LOSSGUARD_TEST_PG_TIMEOUT_S), so that a hang fails fast;
  poison       the embedding row of token POISON (untied head) is 1e38 and rank 1's sample 2 at step NAN_STEP
               carries that token (recover=True): that sample is quarantined, the rest committed;
  resume       `poison` again, a new engine and guard on its events dir: the sample never reaches the model;
  rollback     snapshots every 2 steps; NaN written into rank 1's fp32 master partition after step 5: the
               weights turn non-finite with step 6, the loss at 7 is held and every rank rolls back to the
               snapshot taken before step 5;
  rollback_none  the same with a snapshot every step and one kept: the only snapshot is already bad: halt;
  snap_healthy snapshots every 2 steps, no fault;
  drift        snapshots every 3; rank 1 nudges one of its 16-bit weights right after step 7: the replicas'
               fingerprints differ at 8, which is rolled back to the snapshot before step 7;
  lr_spike     30 steps, snapshots every 3: step 24 runs at 10^4 times the LR on every rank; the loss at 25 is
               far above the run's spread, again on replay: rolled back to the snapshot before step 22;
  mb1poison    micro-batch 1, the poisoned row as in `poison`, carried by rank 1's one sample at step NAN_STEP;
               the STEPS batches twice over (two epochs): the sample is quarantined (the step held: its rank
               has nothing else), and when it comes back at STEPS + NAN_STEP that step is skipped on every rank;
  healthy      recover=True, no fault;
  plain        the same healthy run without lossguard.
The model is tiny GPT-2 with one extra token (POISON) and an untied head, in every scenario.
Every rank writes OUT_DIR/SCENARIO/rank{r}.json (its losses, the held steps, the halt, the engine's counters)
and, at the faulty step, its own shard of the state right before and right after `engine.step()`
(before-rank{r}.pt, after-rank{r}.pt: parameters or ZeRO-3 partitions, the optimizer's state dict, the LR
scheduler, the engine's counters); rank 0 also writes summary.json (its findings).
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import tiny  # noqa: E402

STEPS, NAN_STEP, POISON = 8, 4, tiny.VOCAB
NAN_AT = {"nan_once": {NAN_STEP}, "over_budget": {3, 4, 5}, "transient": {NAN_STEP}, "flaky": {3, 6},
          "replay_oom": {NAN_STEP}}


def model_for(case: str):
    """Tiny GPT-2 with one token more than the data uses and an untied head; in `poison` and `resume` that
    token's embedding row is 1e38: finite, but a sample carrying it overflows the first layer norm."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=tiny.VOCAB + 1, n_positions=tiny.SEQ, n_embd=32, n_layer=2, n_head=2,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=False)
    model = GPT2LMHeadModel(config)
    if case in ("poison", "resume", "mb1poison"):
        with torch.no_grad():
            model.transformer.wte.weight[POISON] = 1e38
    return model


def master_partition(engine) -> torch.Tensor:
    """This rank's fp32 master partition (ZeRO-1/2, ZeRO-3)."""
    optimizer = engine.optimizer
    groups = getattr(optimizer, "single_partition_of_fp32_groups", None) or optimizer.fp32_partitioned_groups_flat
    return groups[0]


def batches_of(rank: int, micro: int, case: str) -> list[dict]:
    data = tiny.Tokens()
    out = []
    for step in range(1, (30 if case == "lr_spike" else STEPS) + 1):
        start = (rank * micro + (step - 1) * micro * 2) % len(data)
        ids = data.ids[start:start + micro].clone()
        labels = ids.clone()
        if rank == 1 and step == NAN_STEP and case == "masked":
            labels[:] = -100
        if rank == 1 and step == NAN_STEP and case in ("poison", "resume"):
            ids[2, 5] = labels[2, 5] = POISON
        if rank == 1 and step == NAN_STEP and case == "mb1poison":
            ids[0, 5] = labels[0, 5] = POISON
        out.append({"input_ids": ids, "labels": labels})
    return out * 2 if case == "mb1poison" else out


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

    stage, case = int(name[1]), name[3:].removesuffix("-bf16").removesuffix("-fp16")
    bf16, fp16 = name.endswith("-bf16"), name.endswith("-fp16")
    counted = tiny.count_collectives()  # every rank must make the same collectives: counted from here
    rank = tiny.rank()
    work = os.path.join(out_dir, name)
    os.makedirs(work, exist_ok=True)
    config = tiny.ds_config(stage, bf16=bf16, fp16=fp16, micro=1 if case == "mb1poison" else 4,
                            **({"check_grad_overflow": False} if bf16 else {}))
    model = model_for(case)
    seconds = os.environ.get("LOSSGUARD_TEST_PG_TIMEOUT_S")  # a test that must fail fast on a hang
    if seconds and not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo", timeout=datetime.timedelta(seconds=int(seconds)))
    fail_next = []  # `replay_oom`: the next forward raises, as an out-of-memory error would

    def maybe_fail(module, args):
        if fail_next:
            fail_next.clear()
            raise RuntimeError("out of memory (simulated, replay_oom)")

    model.register_forward_pre_hook(maybe_fail)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    guard = None
    if case != "plain":
        recover = True
        if case in ("nan_once", "over_budget"):  # hold only: the NaN is the loop's, a replay would not see it
            recover = lossguard.RecoverOptions(budget=2 if case == "over_budget" else 3, window=100, replay=False)
        if case in ("rollback", "snap_healthy"):
            recover = lossguard.RecoverOptions(snapshot_every=2)
        if case in ("lr_spike", "drift"):
            recover = lossguard.RecoverOptions(snapshot_every=3)
        if case == "rollback_none":
            recover = lossguard.RecoverOptions(snapshot_every=1, keep=1)
        events = os.path.join(work, "events")
        if case == "resume":  # a resume from `poison`'s run: the quarantine it wrote, in this run's events dir
            os.makedirs(events, exist_ok=True)
            shutil.copy(os.path.join(out_dir, name.replace("resume", "poison"), "events", "quarantine.jsonl"), events)
        guard = lossguard.attach(engine, events_dir=events, halt_on="error", recover=recover,
                                 halt_checkpoint_dir=os.path.join(work, "ckpt"), fingerprint_every=1)
    steps = batches_of(rank, config["train_micro_batch_size_per_gpu"], case)
    losses, held, seen, halted = [], [], [], None
    try:
        for step, batch in enumerate(guard.batches(steps) if guard is not None else steps, start=1):
            seen.append(int((batch["input_ids"] == POISON).any()))
            loss = engine(**batch).loss
            if rank == 1 and step in NAN_AT.get(case, ()):
                loss = loss * float("nan")  # the loop's own fault: a replay recomputes the loss without it
                fail_next.extend([True] if case == "replay_oom" else [])  # or raises, on this rank alone
            losses.append(float(loss))
            engine.backward(loss)
            if step == NAN_STEP and case in ("nan_once", "masked"):
                torch.save(shard_state(engine), os.path.join(work, f"before-rank{rank}.pt"))
            for group in engine.optimizer.param_groups if case == "lr_spike" and step == 24 else []:
                group["lr"] *= 1e4  # one step at a wildly wrong LR; the scheduler sets it back after the step
            engine.step()
            if step == NAN_STEP and case in ("nan_once", "masked"):
                torch.save(shard_state(engine), os.path.join(work, f"after-rank{rank}.pt"))
            if (step == 4 and case in ("plain", "rollback")) or (step == 7 and case == "rollback"):
                # the state a rollback to the snapshot before step 5 must give back, and what it gave back
                torch.save(shard_state(engine), os.path.join(work, f"{'at4' if step == 4 else 'rolled'}-rank{rank}.pt"))
            if step == 7 and rank == 1 and case == "drift":
                with torch.no_grad():  # this replica alone: its copy of the embedding
                    next(engine.module.parameters()).data.add_(1e-2)
            if step == 5 and rank == 1 and case.startswith("rollback"):
                with torch.no_grad():  # hidden: the 16-bit weights are fine until the next step copies it over
                    master_partition(engine)[0] = float("nan")
            held.append(guard is not None and guard.monitor.held is not None)
    except lossguard.LossguardHalt as halt:
        halted = halt.step
    if guard is not None:
        guard.detach()
    torch.save(shard_state(engine)["params"], os.path.join(work, f"final-rank{rank}.pt"))
    with open(os.path.join(work, f"rank{rank}.json"), "w") as fh:
        json.dump({"losses": losses, "held": held, "halted_at": halted, "global_steps": engine.global_steps,
                   "skipped_steps": engine.skipped_steps, "seen_poison": seen,
                   "collectives": tiny.collectives_since(counted)}, fh)
    if rank == 0:
        findings = [f.to_dict() for f in guard.monitor._emitted] if guard is not None else []
        with open(os.path.join(work, "summary.json"), "w") as fh:
            json.dump({"scenario": name, "halted_at": halted, "findings": findings}, fh, default=str)
    engine.destroy() if hasattr(engine, "destroy") else None


if __name__ == "__main__":
    tiny.run_scenarios(run)
