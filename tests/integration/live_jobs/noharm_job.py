"""Two-rank plain DDP loops (gloo) of healthy but unusual runs, and a run that diverges, each with and without
`lossguard.Guard(recover=True)` (issue 32, "hold only what would harm").

    torchrun --nproc_per_node 2 noharm_job.py OUT_DIR SCENARIO [SCENARIO ...]

Scenario names: CASE-ARM. ARM: `plain` (no lossguard), `recover` (Guard(recover=True), `commit` before the
step), `guard` (fp16 only: Guard without recover, `step` after the step, halt_on="error"), `halt` (Guard
without recover, `step` after the step, halt_on="broken"; the diverge case then runs DIVERGE_HALT_STEPS). CASE:
  shift    SHIFT_STEPS steps of an easy task (each token's successor is the next token), then from SHIFT_AT a
           harder one (a different successor map): the loss leaps and stays high while the run learns it;
  hard     HARD_STEPS steps of the easy task with one batch of the other task every HARD_EVERY steps;
  fp16     FP16_STEPS steps under CPU fp16 autocast with a torch.amp GradScaler that starts at 2^24: its
           first steps overflow (inf gradients, the scaler skips them and halves its scale), as a GPU run's
           start-up does at its default 2^16 with larger gradients;
  diverge  Adam at LR 30 (a typo'd LR): the loss leaps from ~2.8 to thousands at step 2 and stays there.
Every rank writes OUT_DIR/SCENARIO/rank{r}.json (losses, commits, halt, eval losses on both tasks, the
scaler's scales), and its final weights (weights-rank{r}.pt); rank 0 writes summary.json (its findings).
"""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import recover_job  # noqa: E402
import tiny  # noqa: E402

VOCAB, SEQ = recover_job.VOCAB, recover_job.SEQ
SHIFT_STEPS, SHIFT_AT, HARD_STEPS, HARD_EVERY, FP16_STEPS, DIVERGE_STEPS = 120, 81, 80, 35, 20, 12
DIVERGE_HALT_STEPS = 40  # a halt on a divergence waits for the logs that could refute it (LOSS005.settle_logs)


def sequences(seed: int, hard: bool, rows: int = 4) -> dict[str, torch.Tensor]:
    """Token sequences that follow the easy successor map (t -> t + 1) or the hard one (t -> 5t + 3)."""
    ids = torch.empty(rows, SEQ, dtype=torch.long)
    ids[:, 0] = torch.randint(0, VOCAB, (rows,), generator=torch.Generator().manual_seed(seed))
    for t in range(1, SEQ):
        ids[:, t] = (5 * ids[:, t - 1] + 3) % VOCAB if hard else (ids[:, t - 1] + 1) % VOCAB
    return {"ids": ids, "labels": ids.clone()}


def batch_at(case: str, step: int, rank: int) -> dict[str, torch.Tensor]:
    hard = (case == "shift" and step >= SHIFT_AT) or (case == "hard" and step % HARD_EVERY == 0)
    return sequences(1000 * step + rank, hard)


def run(out_dir: str, name: str) -> None:
    import lossguard

    case, arm = name.split("-")
    rank, work, model, optimizer = recover_job.start(out_dir, name)
    if case == "diverge":
        optimizer = torch.optim.Adam(model.parameters(), lr=30.0)
    fp16 = case == "fp16"
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 24) if fp16 else None
    steps = {"shift": SHIFT_STEPS, "hard": HARD_STEPS, "fp16": FP16_STEPS, "diverge": DIVERGE_STEPS}[case]
    if case == "diverge" and arm == "halt":
        steps = DIVERGE_HALT_STEPS
    halt_on = {"halt": "broken", "guard": "error"}.get(arm)
    guard = None if arm == "plain" else lossguard.Guard(
        model, optimizer, **({"scaler": scaler} if fp16 else {}), events_dir=os.path.join(work, "events"), console=rank == 0,
        recover=arm == "recover", **({"halt_on": halt_on} if halt_on else {}))
    out: dict = {"losses": [], "commits": [], "halted_at": None, "scales": []}
    try:
        for step in range(1, steps + 1):
            batch = batch_at(case, step, rank)
            with torch.autocast("cpu", dtype=torch.float16, enabled=fp16):
                loss = model(batch["ids"], batch["labels"])
            out["losses"].append(loss.item())
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
                out["scales"].append(scaler.get_scale())
            else:
                loss.backward()
            ok = True if guard is None or arm in ("guard", "halt") else guard.commit(loss=loss, labels=batch["labels"])
            out["commits"].append(ok)
            if ok:
                scaler.step(optimizer) if scaler is not None else optimizer.step()
            if scaler is not None:
                scaler.update()
            if arm in ("guard", "halt"):
                guard.step(loss=loss, labels=batch["labels"])
            optimizer.zero_grad()
    except lossguard.LossguardHalt as halt:
        out["halted_at"] = halt.step
    with torch.no_grad():
        out["eval"] = {task: model.module(**sequences(99 + rank, task == "hard", rows=32)).item()
                       for task in ("easy", "hard")}
    torch.save({k: v.clone() for k, v in model.module.state_dict().items()}, os.path.join(work, f"weights-rank{rank}.pt"))
    findings = []
    if guard is not None:
        guard.close()
        findings = [f.to_dict() for f in guard.monitor._emitted]
    if rank == 0:
        with open(os.path.join(work, "summary.json"), "w") as fh:
            json.dump({"findings": findings}, fh, default=str)
    with open(os.path.join(work, f"rank{rank}.json"), "w") as fh:
        json.dump(out, fh)


if __name__ == "__main__":
    tiny.run_scenarios(run)
