"""Two-rank Lightning DDP job (CPU, gloo) guarded by LossguardLightningCallback.

    torchrun --nproc_per_node 2 lightning_job.py OUT_DIR SCENARIO [SCENARIO ...]

`healthy`: a learnable run, 8 steps. `nan`: rank 1's loss is NaN at step 4; `min_steps=8` would keep a run that
only sets `should_stop` going; the guard checkpoints and stops, then exits with status 3
(`exit_code_on_halt`), so it must come last. Each rank writes OUT_DIR/SCENARIO/rank{r}.json in a `finally`,
with the SystemExit code it saw, if any.
"""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import tiny  # noqa: E402

FAULT_STEP = 4
LR = 1e-3
CLIP = 0.05  # far below the tiny model's gradient norms: a recorded norm above it was read before clipping


def module(scenario: str):
    import lightning as L

    class TinyLM(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = tiny.tiny_gpt2()

        def training_step(self, batch, batch_idx):
            loss = self.model(**batch).loss
            if scenario == "nan" and tiny.rank() == 1 and self.trainer.global_step + 1 == FAULT_STEP:
                loss = loss * float("nan")
            return loss

        def configure_optimizers(self):  # a per-step warm-up: step k trains at LR * k / 8
            optimizer = torch.optim.AdamW(self.parameters(), lr=LR)
            warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: (s + 1) / 8)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": warmup, "interval": "step"}}

    return TinyLM()


def run(out_dir: str, scenario: str) -> None:
    import lightning as L
    from torch.utils.data import DataLoader

    from lossguard import LossguardLightningCallback

    work = os.path.join(out_dir, scenario)
    os.makedirs(work, exist_ok=True)
    guard = LossguardLightningCallback(events_dir=os.path.join(work, "events"), halt_on="warning",
                                       fingerprint_every=1, halt_checkpoint_dir=os.path.join(work, "ckpt"),
                                       exit_code_on_halt=3 if scenario == "nan" else None)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=8, callbacks=[guard],
                        gradient_clip_val=CLIP, min_steps=8 if scenario == "nan" else None, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    exit_code = None
    try:
        trainer.fit(module(scenario), DataLoader(tiny.Tokens(64), batch_size=4))
    except SystemExit as exc:
        exit_code = exc.code
        raise
    finally:
        monitor = guard.guard.monitor if guard.guard else None
        summary = {"scenario": scenario, "rank": tiny.rank(), "exit_code": exit_code,
                   "halted_at": guard.halted_at, "global_step": trainer.global_step,
                   "checkpoint": guard.checkpoint_path,
                   "findings": [f.to_dict() for f in monitor._emitted] if monitor else []}
        with open(os.path.join(work, f"rank{tiny.rank()}.json"), "w") as fh:
            json.dump(summary, fh, default=str)


if __name__ == "__main__":
    tiny.run_scenarios(run)
