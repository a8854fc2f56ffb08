"""Two-rank Lightning DDP job (CPU, gloo) guarded by LossguardLightningCallback.

    torchrun --nproc_per_node 2 lightning_job.py OUT_DIR SCENARIO [SCENARIO ...]

`healthy`: a learnable run, 8 steps. `nan`: rank 1's loss is NaN at step 4; `min_steps=8` would keep a run that
only sets `should_stop` going; the guard checkpoints and stops, then exits with status 3
(`exit_code_on_halt`), so it must come last. `recover`: the same NaN with `recover=True`: held on both ranks,
the run trains on; `recover_healthy` / `plain`: recover=True without a fault / no guard at all. Each rank
writes OUT_DIR/SCENARIO/rank{r}.json in a `finally`, with the SystemExit code it saw, if any, and the losses
`training_step` returned; in `recover`, its model, optimizer and scheduler state as step 4 began and as
step 5 began (before-rank{r}.pt, after-rank{r}.pt). `recover`, `recover_healthy` and `plain` keep the ranks'
mean training loss per step in csv/version_0/metrics.csv (Lightning's CSVLogger). `fp16_plain` /
`fp16_guard` / `fp16_recover`: the healthy run under fp16 autocast (`MixedPrecision("16-mixed", "cpu")`) with
a GradScaler that starts at 2^24, so its first steps overflow and it skips them, halving its scale (a GPU
run's start-up at 2^16, with larger gradients): without lossguard, guarded (halt_on="warning"), and with
recover=True; each rank also writes its final weights (weights-rank{r}.pt) and the scales the scaler went
through.
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
            if scenario in ("nan", "recover") and tiny.rank() == 1 and self.trainer.global_step + 1 == FAULT_STEP:
                loss = loss * float("nan")
            self.log("train_loss", loss, sync_dist=True)  # the ranks' mean, as metrics.csv keeps it (NaN held)
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
    recover = scenario.startswith("recover") or scenario.endswith("_recover")
    fp16 = scenario.startswith("fp16")
    guard = LossguardLightningCallback(events_dir=os.path.join(work, "events"), halt_on="warning" if not recover
                                       else "error", fingerprint_every=1,
                                       halt_checkpoint_dir=os.path.join(work, "ckpt"),
                                       exit_code_on_halt=3 if scenario == "nan" else None, recover=recover)
    losses: list[float] = []
    scales: list[float] = []

    class Probe(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if scenario == "recover" and trainer.global_step in (FAULT_STEP - 1, FAULT_STEP):
                scheduler = trainer.lr_scheduler_configs[0].scheduler
                state = {"model": {k: v.clone() for k, v in pl_module.state_dict().items()},
                         "optimizer": trainer.optimizers[0].state_dict(), "scheduler": scheduler.state_dict()}
                when = "before" if trainer.global_step == FAULT_STEP - 1 else "after"
                torch.save(state, os.path.join(work, f"{when}-rank{tiny.rank()}.pt"))

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            losses.append(float(outputs["loss"]))
            if fp16:
                scales.append(trainer.precision_plugin.scaler.get_scale())

    callbacks = [Probe()] + ([] if scenario in ("plain", "fp16_plain") else [guard])
    plugins = []
    if fp16:
        from lightning.pytorch.plugins import MixedPrecision

        plugins = [MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu", init_scale=2.0 ** 24))]
    logger = False  # the recover scenarios keep metrics.csv (csv/version_0/), as a CSVLogger user does
    if scenario.startswith("recover") or scenario == "plain":
        from lightning.pytorch.loggers import CSVLogger

        logger = CSVLogger(work, name="csv")
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=8, callbacks=callbacks,
                        gradient_clip_val=CLIP, min_steps=8 if scenario == "nan" else None, logger=logger,
                        log_every_n_steps=1, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, plugins=plugins)
    exit_code = None
    lm = module(scenario)
    try:
        trainer.fit(lm, DataLoader(tiny.Tokens(64), batch_size=4))
        if fp16:
            torch.save(lm.state_dict(), os.path.join(work, f"weights-rank{tiny.rank()}.pt"))
    except SystemExit as exc:
        exit_code = exc.code
        raise
    finally:
        monitor = guard.guard.monitor if guard.guard else None
        summary = {"scenario": scenario, "rank": tiny.rank(), "exit_code": exit_code, "losses": losses, "scales": scales,
                   "halted_at": guard.halted_at, "global_step": trainer.global_step,
                   "checkpoint": guard.checkpoint_path,
                   "findings": [f.to_dict() for f in monitor._emitted] if monitor else []}
        with open(os.path.join(work, f"rank{tiny.rank()}.json"), "w") as fh:
            json.dump(summary, fh, default=str)


if __name__ == "__main__":
    tiny.run_scenarios(run)
