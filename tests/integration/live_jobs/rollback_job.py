"""Two-rank plain DDP loop (gloo) with `Guard(recover=RecoverOptions(snapshot_every=3), scheduler=...)`.

    torchrun --nproc_per_node 2 rollback_job.py OUT_DIR SCENARIO [SCENARIO ...]

Scenarios: `nan_weights` (rank 1 writes NaN into its weights right after `optimizer.step()` of step
NAN_STEP), `lr_spike` (30 steps, `commit(forward=...)`: the LR is 10^4 times too high for the one step
SPIKE_STEP on every rank; the weights stay finite but the loss explodes at the next step, comes back on
replay, and the run is rolled back), `drift` (fingerprints every step; rank 1 nudges one of its weights
right after step DRIFT_STEP: the replicas differ at the next step and are rolled back), `snap_healthy` (snapshots on, no fault), `plain` (the same run without
lossguard), `nan_default` (as `nan_weights` under `Guard(recover=True)` alone: no `snapshot_every`, no
`scheduler=`; snapshots on by default, every 10 steps, the LambdaLR found), `restore_fails` (as `nan_weights`, but loading the optimizer's state raises on rank 1 alone
during the restore, as an out-of-memory error would: every rank halts at the held step; run alone with a
short process-group timeout, LOSSGUARD_TEST_PG_TIMEOUT_S). Every rank
writes OUT_DIR/SCENARIO/rank{r}.json: its losses, what commit returned, whether its final weights are
finite, the halt, the final weights (rank{r}.pt).
"""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import tiny  # noqa: E402
from recover_job import batch_at, start  # noqa: E402

STEPS, NAN_STEP, EVERY, SPIKE_STEP, DRIFT_STEP = 12, 5, 3, 24, 7


def run(out_dir: str, name: str) -> None:
    import lossguard

    rank, work, model, optimizer = start(out_dir, name)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))
    default = name == "nan_default"  # recover=True alone: snapshots decided by the host, the scheduler found
    guard = None if name == "plain" else lossguard.Guard(
        model, optimizer, **({} if default else {"scheduler": scheduler}), events_dir=os.path.join(work, "events"),
        fingerprint_every=1 if name == "drift" else 4,
        recover=True if default else lossguard.RecoverOptions(snapshot_every=EVERY))
    out: dict = {"losses": [], "commits": [], "halted_at": None}
    if name == "restore_fails" and rank == 1:
        def load_state_dict(state):
            raise RuntimeError("out of memory (simulated, restore_fails)")

        optimizer.load_state_dict = load_state_dict
    loader = [batch_at(step, rank) for step in range(1, (30 if name == "lr_spike" else STEPS) + 1)]
    forward = (lambda b: model(b["ids"], b["labels"])) if name == "lr_spike" else None
    try:
        for batch in (loader if guard is None else guard.batches(loader)):
            loss = model(batch["ids"], batch["labels"])
            loss.backward()
            out["losses"].append(loss.item())
            ok = True if guard is None else guard.commit(loss=loss, labels=batch["labels"], batch=batch,
                                                          forward=forward)
            out["commits"].append(ok)
            if ok:
                spike = name == "lr_spike" and len(out["losses"]) == SPIKE_STEP
                for group in optimizer.param_groups if spike else []:
                    group["lr"] *= 1e4  # one step at a wildly wrong LR; LambdaLR sets it back at its step
                optimizer.step()
                scheduler.step()
            optimizer.zero_grad()
            if name == "drift" and rank == 1 and len(out["losses"]) == DRIFT_STEP:
                with torch.no_grad():  # this replica alone drifts: finite, and invisible to the loss
                    model.module.head.weight[0, 0] += 1e-2
            if name in ("nan_weights", "restore_fails", "nan_default") and rank == 1 and len(out["losses"]) == NAN_STEP:
                with torch.no_grad():  # a fault the gate cannot see: it is applied after the step
                    model.module.head.weight[0, 0] = float("nan")
    except lossguard.LossguardHalt as halt:
        out["halted_at"] = halt.step
    if guard is not None:
        guard.close()
    out["finite"] = all(bool(torch.isfinite(p).all()) for p in model.parameters())
    out["scheduler"] = scheduler.state_dict()["last_epoch"]
    torch.save({k: v.clone() for k, v in model.module.state_dict().items()}, os.path.join(work, f"rank{rank}.pt"))
    with open(os.path.join(work, f"rank{rank}.json"), "w") as fh:
        json.dump(out, fh)
    if rank == 0:
        with open(os.path.join(work, "summary.json"), "w") as fh:
            json.dump({"findings": []}, fh)


if __name__ == "__main__":
    tiny.run_scenarios(run)
