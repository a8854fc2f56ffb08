"""Two-rank plain DDP loops (gloo) that do no harm with snapshots on by default (issue 32, items 5 and 6): each
healthy run trains under `Guard(recover=True)` (no `snapshot_every`: on, decided by the host's free memory)
exactly as without lossguard.

    torchrun --nproc_per_node 2 noharm_snap_job.py OUT_DIR SCENARIO [SCENARIO ...]

Scenario names: CASE-ARM. ARM: `plain` (no lossguard) or `recover` (Guard(recover=True), `commit` before the
step). CASE:
  steplr    Adam under a StepLR (halved every 5 steps) the Guard is not given: found at the first step;
  lambdalr  Adam under a LambdaLR warm-up, given as `scheduler=`;
  lora      a LoRA adapter on the frozen head (peft when installed, else a hand-made low-rank adapter), the
            base frozen: the snapshot holds the adapter;
  ga4       gradient accumulation over 4 micro-batches (`observe` for the first three, DDP's `no_sync`).
STEPS optimizer steps each (snapshots before steps 1, 11, 21). Every rank writes OUT_DIR/SCENARIO/rank{r}.json
(losses, commits, halt, the scheduler's last LR) and its final weights (weights-rank{r}.pt).
"""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import noharm_job  # noqa: E402
import recover_job  # noqa: E402
import tiny  # noqa: E402

STEPS, MICRO = 30, 4


class LowRank(torch.nn.Module):
    """A frozen linear layer plus a trained low-rank update (B starts at zero, as LoRA's does)."""

    def __init__(self, base: torch.nn.Linear, rank: int = 4) -> None:
        super().__init__()
        self.base = base.requires_grad_(False)
        self.a = torch.nn.Parameter(torch.randn(rank, base.in_features) * 0.1)
        self.b = torch.nn.Parameter(torch.zeros(base.out_features, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + x @ self.a.t() @ self.b.t()


def lora_net() -> torch.nn.Module:
    net = recover_job.Net()
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        net.requires_grad_(False)
        net.head = LowRank(net.head)
        return net
    return get_peft_model(net, LoraConfig(r=4, lora_alpha=8, target_modules=["head"]))


def run(out_dir: str, name: str) -> None:
    import lossguard

    case, arm = name.split("-")
    rank, work, model, optimizer = recover_job.start(out_dir, name, lora_net if case == "lora" else recover_job.Net)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.5) if case == "steplr" else \
        torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 5)) if case == "lambdalr" else None
    guard = None if arm == "plain" else lossguard.Guard(
        model, optimizer, **({"scheduler": scheduler} if case == "lambdalr" else {}),
        events_dir=os.path.join(work, "events"), console=rank == 0, recover=True)
    micro = MICRO if case == "ga4" else 1
    out: dict = {"losses": [], "commits": [], "halted_at": None}
    try:
        for step in range(1, STEPS + 1):
            for index in range(micro):
                batch = noharm_job.sequences(10_000 * step + 100 * index + rank, hard=False)
                last = index == micro - 1
                with model.no_sync() if not last else _nothing():
                    loss = model(batch["ids"], batch["labels"])
                    (loss / micro).backward()
                out["losses"].append(loss.item())
                if guard is not None and not last:
                    guard.observe(loss=loss, labels=batch["labels"])
            ok = True if guard is None else guard.commit(loss=loss, labels=batch["labels"])
            out["commits"].append(ok)
            if ok:
                optimizer.step()
                if scheduler is not None:
                    scheduler.step()
            optimizer.zero_grad()
    except lossguard.LossguardHalt as halt:
        out["halted_at"] = halt.step
    if guard is not None:
        guard.close()
    out["lr"] = optimizer.param_groups[0]["lr"]
    torch.save({k: v.clone() for k, v in model.module.state_dict().items()}, os.path.join(work, f"weights-rank{rank}.pt"))
    if rank == 0:
        with open(os.path.join(work, "summary.json"), "w") as fh:
            json.dump({"findings": []}, fh)
    with open(os.path.join(work, f"rank{rank}.json"), "w") as fh:
        json.dump(out, fh)


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


if __name__ == "__main__":
    tiny.run_scenarios(run)
