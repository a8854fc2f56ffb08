"""The live guard in a Lightning `Trainer`: `LossguardLightningCallback`.

    python examples/live_lightning.py                    # one process, CPU
    python examples/live_lightning.py --devices 2        # two ranks, DDP over gloo (Lightning starts them)
    python examples/live_lightning.py --nan-at 5         # a NaN loss at step 5: halted, checkpointed, exit status 3
    python examples/live_lightning.py --explode-at 5     # the learning rate explodes at step 5
    lossguard watch --halt-on broken -- python examples/live_lightning.py --nan-at 5 --no-guard   # watch alone

A tiny GPT-2 built from a config (no download) learns to count on CPU. The progress bar shows the loss
(`self.log(..., prog_bar=True)`); `lossguard watch` reads it redraw by redraw.
"""

from __future__ import annotations

import argparse

import lightning as L
import torch
from torch.utils.data import DataLoader
from transformers import GPT2Config, GPT2LMHeadModel

from lossguard import LossguardLightningCallback

EXPLODE = 1e3  # demo only: --explode-at multiplies the learning rate by this


class TinyLM(L.LightningModule):
    def __init__(self, nan_at: int = 0, explode_at: int = 0) -> None:
        super().__init__()
        self.model = GPT2LMHeadModel(GPT2Config(vocab_size=96, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                                                bos_token_id=0, eos_token_id=0))
        self.nan_at, self.explode_at = nan_at, explode_at

    def training_step(self, batch, batch_idx):
        loss = self.model(**batch).loss
        step = self.trainer.global_step + 1  # global_step counts the optimizer steps done
        if step == self.nan_at:  # demo only: a NaN loss at that step
            loss = loss * float("nan")
        if step == self.explode_at:  # demo only: from that step on, the learning rate is far too high
            for group in self.trainer.optimizers[0].param_groups:
                group["lr"] *= EXPLODE
        self.log("loss", loss, prog_bar=True)  # shown on the progress bar
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def counting_data(n: int = 64, seq: int = 32, vocab: int = 96) -> list[dict]:
    starts = torch.randint(0, vocab, (n, 1), generator=torch.Generator().manual_seed(0))
    return [{"input_ids": ids, "labels": ids} for ids in (starts + torch.arange(seq)) % vocab]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="runs/live_lightning")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--nan-at", type=int, default=0, help="demo: a NaN loss at this step")
    parser.add_argument("--explode-at", type=int, default=0, help="demo: the learning rate explodes at this step")
    parser.add_argument("--no-guard", action="store_true", help="no guard (to try `lossguard watch` alone)")
    args = parser.parse_args()

    # halt_on="broken": stop on every rank when the run is broken; halt_checkpoint_dir: every rank calls
    # trainer.save_checkpoint there first; exit_code_on_halt=3: then the script exits 3.
    guard = LossguardLightningCallback(events_dir=f"{args.out}/events", halt_on="broken",
                                       halt_checkpoint_dir=f"{args.out}/halt", exit_code_on_halt=3)
    trainer = L.Trainer(accelerator="cpu", devices=args.devices, strategy="ddp" if args.devices > 1 else "auto",
                        max_steps=args.steps, gradient_clip_val=1.0, callbacks=[] if args.no_guard else [guard],
                        logger=False, enable_checkpointing=False, enable_model_summary=False,
                        default_root_dir=args.out)
    model = TinyLM(args.nan_at, args.explode_at)
    trainer.fit(model, DataLoader(counting_data(), batch_size=4))  # halted: SystemExit(3) here
    trainer.save_checkpoint(f"{args.out}/final.ckpt")  # reached only by a run that did not halt


if __name__ == "__main__":
    main()
