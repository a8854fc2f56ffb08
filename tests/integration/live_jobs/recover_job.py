"""Two-rank plain DDP loop (gloo) gated by `lossguard.Guard(recover=...)`: `guard.commit` before the step.

    torchrun --nproc_per_node 2 recover_job.py OUT_DIR SCENARIO [SCENARIO ...]

Scenarios: `nan_once` (rank 1's loss is NaN at step NAN_STEP, recover=True), `over_budget` (rank 1's loss is
NaN at steps 3, 4, 5 with a budget of 2 in 10), `jump` (JUMP_STEPS steps, rank 1's loss x JUMP_FACTOR at
JUMP_STEP, past the gate's warm-up), `healthy` (recover=True, no fault), `plain` (the same healthy run
without lossguard). Every rank writes OUT_DIR/SCENARIO/rank{r}.json (its losses, what commit
returned, whether the held gradients were dropped, the halt, the collectives it made) and, in `nan_once`,
its weights, optimizer and scheduler state right before and right after the held step (before.pt,
after.pt); rank 0 also writes summary.json (its findings).
"""

from __future__ import annotations

import datetime
import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))
import tiny  # noqa: E402

STEPS, NAN_STEP, VOCAB, SEQ = 12, 4, 16, 8
# the jump must come after the gate's warm-up (monitor/jump.py WARMUP, 20 committed steps)
JUMP_STEPS, JUMP_STEP, JUMP_FACTOR = 30, 26, 50.0
POISON = {"nan_once": {NAN_STEP}, "over_budget": {3, 4, 5}, "jump": {JUMP_STEP}, "healthy": set(), "plain": set()}


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, 16)
        self.head = torch.nn.Linear(16, VOCAB)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.emb(ids))
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1))


def batch_at(step: int, rank: int) -> dict[str, torch.Tensor]:
    """Each rank's own batch, the same in every scenario (a seed per rank and step)."""
    ids = torch.randint(0, VOCAB, (4, SEQ), generator=torch.Generator().manual_seed(1000 * step + rank))
    return {"ids": ids, "labels": ids.clone()}


def state(model, optimizer, scheduler) -> dict:
    return {"model": {k: v.clone() for k, v in model.state_dict().items()},
            "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}


def start(out_dir: str, name: str, make_net=Net):
    """(rank, the scenario's folder, DDP model, Adam): what every recovery job's scenario starts from. The net
    is built after the seed, so each scenario of a job starts from the same weights."""
    if not dist.is_initialized():  # a test that must fail fast on a hang sets a short timeout
        seconds = os.environ.get("LOSSGUARD_TEST_PG_TIMEOUT_S")
        dist.init_process_group("gloo", **({"timeout": datetime.timedelta(seconds=int(seconds))} if seconds else {}))
    work = os.path.join(out_dir, name)
    os.makedirs(work, exist_ok=True)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(make_net())
    return dist.get_rank(), work, model, torch.optim.Adam(model.parameters(), lr=1e-2)


def run(out_dir: str, name: str) -> None:
    import lossguard

    rank, work, model, optimizer = start(out_dir, name)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))
    recover = lossguard.RecoverOptions(budget=2, window=10) if name == "over_budget" else True
    guard = None if name == "plain" else lossguard.Guard(
        model, optimizer, events_dir=os.path.join(work, "events"), recover=recover, fingerprint_every=4)
    out: dict = {"losses": [], "commits": [], "grads_dropped": [], "halted_at": None}
    try:
        for step in range(1, (JUMP_STEPS if name == "jump" else STEPS) + 1):
            batch = batch_at(step, rank)
            loss = model(batch["ids"], batch["labels"])
            if step in POISON[name] and rank == 1:
                loss = loss * (JUMP_FACTOR if name == "jump" else float("nan"))
            loss.backward()
            out["losses"].append(loss.item())
            if step == NAN_STEP and name == "nan_once":
                torch.save(state(model.module, optimizer, scheduler), os.path.join(work, f"before-rank{rank}.pt"))
            ok = True if guard is None else guard.commit(loss=loss, labels=batch["labels"])
            out["commits"].append(ok)
            if ok:
                optimizer.step()
                scheduler.step()
            else:  # what the guard did to the held gradients, before the loop's own zero_grad
                out["grads_dropped"].append(all(p.grad is None for p in model.parameters()))
            optimizer.zero_grad()
            if step == NAN_STEP and name == "nan_once":
                torch.save(state(model.module, optimizer, scheduler), os.path.join(work, f"after-rank{rank}.pt"))
    except lossguard.LossguardHalt as halt:
        out["halted_at"] = halt.step
    if guard is not None:
        guard.close()
        out["steps_by_path"] = guard.monitor.steps_by_path
        if rank == 0:
            with open(os.path.join(work, "summary.json"), "w") as fh:
                json.dump({"findings": [f.to_dict() for f in guard.monitor._emitted]}, fh, default=str)
    elif rank == 0:
        with open(os.path.join(work, "summary.json"), "w") as fh:
            json.dump({"findings": []}, fh)
    with open(os.path.join(work, f"rank{rank}.json"), "w") as fh:
        json.dump(out, fh)


if __name__ == "__main__":
    tiny.run_scenarios(run)
