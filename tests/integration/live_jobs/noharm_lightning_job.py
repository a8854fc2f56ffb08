"""Two-rank Lightning DDP runs (CPU, gloo) that are healthy but unusual, with and without
`LossguardLightningCallback(recover=True)` (issue 32, the do-no-harm suite).

    torchrun --nproc_per_node 2 noharm_lightning_job.py OUT_DIR SCENARIO [SCENARIO ...]

Scenario names: CASE-ARM. ARM: `plain` (no lossguard) or `recover`. CASE: `shift` (four sequences a rank a
step) or `ga4` (`accumulate_grad_batches=4`, two sequences a micro-batch); either trains noharm_hf_job.STEPS
optimizer steps of the easy task, then from SHIFT_AT the harder one (the loss leaps far above the run's
spread, the gradient norm stays ordinary), on noharm_hf_job's bigram LM, at a constant LR under a
step-interval LambdaLR. Every rank writes OUT_DIR/SCENARIO/rank{r}.json (each micro-batch's loss as
`training_step` returned it, Lightning's global step, the halt) and final-rank{r}.pt (its weights); rank 0
writes summary.json (its findings).
"""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import tiny  # noqa: E402
from noharm_hf_job import ACCUMULATE, LR, MICRO, STEPS, BigramLM, Shifting, collate  # noqa: E402


def run(out_dir: str, name: str) -> None:
    import lightning as L
    from torch.utils.data import DataLoader

    from lossguard import LossguardLightningCallback

    case, arm = name.split("-")
    work = os.path.join(out_dir, name)
    os.makedirs(work, exist_ok=True)
    losses: list[float] = []

    class LM(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = BigramLM()

        def training_step(self, batch, batch_idx):
            loss = self.model(**batch)["loss"]
            losses.append(float(loss.detach()))
            return loss

        def configure_optimizers(self):  # a scheduler Lightning steps every optimizer step, at a constant LR
            optimizer = torch.optim.Adam(self.parameters(), lr=LR)
            constant = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": constant, "interval": "step"}}

    guard = LossguardLightningCallback(events_dir=os.path.join(work, "events"), recover=True) \
        if arm == "recover" else None
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=STEPS,
                        accumulate_grad_batches=ACCUMULATE.get(case, 1), callbacks=[guard] if guard else [],
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    lm = LM()
    data = Shifting(case)
    trainer.fit(lm, DataLoader(data, batch_size=MICRO[case], collate_fn=collate(case)))
    rank = tiny.rank()
    torch.save({k: v.detach().clone() for k, v in lm.state_dict().items()}, os.path.join(work, f"final-rank{rank}.pt"))
    with open(os.path.join(work, f"rank{rank}.json"), "w") as fh:
        json.dump({"losses": losses, "global_step": trainer.global_step,
                   "halted_at": guard.halted_at if guard else None}, fh)
    if rank == 0:
        monitor = guard.guard.monitor if guard and guard.guard else None
        with open(os.path.join(work, "summary.json"), "w") as fh:
            json.dump({"findings": [f.to_dict() for f in monitor._emitted] if monitor else []}, fh, default=str)


if __name__ == "__main__":
    tiny.run_scenarios(run)
