"""The live guard in a Lightning `Trainer`: `LossguardLightningCallback`.

    python examples/live_lightning.py                    # one process, CPU
    python examples/live_lightning.py --devices 2        # two ranks, DDP over gloo (Lightning starts them)
    python examples/live_lightning.py --nan-at 5         # a NaN loss at step 5: halted, checkpointed, exit status 3

A tiny GPT-2 built from a config (no download) learns to count on CPU.
"""

from __future__ import annotations

import argparse

import lightning as L
import torch
from torch.utils.data import DataLoader
from transformers import GPT2Config, GPT2LMHeadModel

from lossguard import LossguardLightningCallback


class TinyLM(L.LightningModule):
    def __init__(self, nan_at: int = 0) -> None:
        super().__init__()
        self.model = GPT2LMHeadModel(GPT2Config(vocab_size=96, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                                                bos_token_id=0, eos_token_id=0))
        self.nan_at = nan_at

    def training_step(self, batch, batch_idx):
        loss = self.model(**batch).loss
        if self.trainer.global_step + 1 == self.nan_at:  # demo only: a NaN loss at that step
            loss = loss * float("nan")
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
    parser.add_argument("--nan-at", type=int, default=0)
    args = parser.parse_args()

    # halt_on="broken": stop on every rank when the run is broken; halt_checkpoint_dir: every rank calls
    # trainer.save_checkpoint there first; exit_code_on_halt=3: then the script exits 3.
    guard = LossguardLightningCallback(events_dir=f"{args.out}/events", halt_on="broken",
                                       halt_checkpoint_dir=f"{args.out}/halt", exit_code_on_halt=3)
    trainer = L.Trainer(accelerator="cpu", devices=args.devices, strategy="ddp" if args.devices > 1 else "auto",
                        max_steps=args.steps, gradient_clip_val=1.0, callbacks=[guard], logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, default_root_dir=args.out)
    trainer.fit(TinyLM(args.nan_at), DataLoader(counting_data(), batch_size=4))  # halted: SystemExit(3) here
    trainer.save_checkpoint(f"{args.out}/final.ckpt")  # reached only by a run that did not halt


if __name__ == "__main__":
    main()
