"""Write tests/fixtures/lightning/*.log: the real output of a tiny PyTorch Lightning run, as a pipe receives
it, with the tqdm bar and with the rich bar (Lightning's default where rich is installed; told the pipe is
terminal-like, as `lossguard watch` tells it). Two faults: a NaN loss from step 11 on, and a learning rate so
high that the loss explodes. `python scripts/make_lightning_logs.py` (needs `lightning`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "lightning"

JOB = r'''
import sys, time, warnings, torch, lightning as L
from torch.utils.data import DataLoader, TensorDataset
warnings.filterwarnings("ignore")
mode, bar = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
X = torch.randn(640, 16); W = torch.randn(16, 1); Y = X @ W + 0.1 * torch.randn(640, 1)

class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))

    def training_step(self, batch, index):
        time.sleep(0.1)  # a step as long as a small real one: the stop signal lands within a step or two
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        if mode == "nan" and self.global_step >= 10:
            loss = loss * float("nan")
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=5.0 if mode == "explode" else 0.05)

from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar
progress = TQDMProgressBar(refresh_rate=1) if bar == "tqdm" else RichProgressBar()
trainer = L.Trainer(max_steps=40, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                    enable_model_summary=False, callbacks=[progress], log_every_n_steps=1)
trainer.fit(Regressor(), DataLoader(TensorDataset(X, Y), batch_size=16))
'''


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TTY_COMPATIBLE": "1", "PYTHONUNBUFFERED": "1", "PYTHONWARNINGS": "ignore"}
    for mode in ("nan", "explode"):
        for bar in ("tqdm", "rich"):
            proc = subprocess.run([sys.executable, "-c", JOB, mode, bar], env=env, capture_output=True,
                                  timeout=300)
            if proc.returncode != 0:
                sys.exit(proc.stderr.decode()[-3000:])
            (OUT / f"{mode}-{bar}.log").write_bytes(proc.stdout + proc.stderr)
            print(f"wrote {OUT / f'{mode}-{bar}.log'}")


if __name__ == "__main__":
    main()
