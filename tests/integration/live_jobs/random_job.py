"""Two-rank accelerate loop guarded by `lossguard.Guard`, on random tokens: nothing to learn.

    torchrun --nproc_per_node 2 random_job.py OUT_DIR random

A tiny GPT-2 trained with AdamW on uniformly random tokens: its loss starts at about ln(VOCAB) and has
nowhere to go, while the optimizer updates the weights every step. Rank 0 writes the findings to
OUT_DIR/random/summary.json; every rank writes its events file.
"""

from __future__ import annotations

import json
import os
import sys

import torch
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, os.path.dirname(__file__))
import tiny  # noqa: E402

STEPS = 24


class RandomTokens(Dataset):
    def __init__(self, n: int = 512, seed: int = 0) -> None:
        self.ids = torch.randint(0, tiny.VOCAB, (n, tiny.SEQ), generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i].clone()}


def run(out_dir: str, name: str) -> None:
    from accelerate import Accelerator

    import lossguard

    work = os.path.join(out_dir, name)
    accelerator = Accelerator(cpu=True)
    model = tiny.tiny_gpt2()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(RandomTokens(), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(0))
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    guard = lossguard.Guard(model, optimizer, events_dir=os.path.join(work, "events"), fingerprint_every=4)
    model.train()
    for step, batch in enumerate(loader, 1):
        loss = model(**batch).loss
        accelerator.backward(loss)
        optimizer.step()
        guard.step(loss=loss, batch=batch)
        optimizer.zero_grad()
        if step == STEPS:
            break
    guard.close()
    if tiny.rank() == 0:
        with open(os.path.join(work, "summary.json"), "w") as fh:
            json.dump({"findings": [f.to_dict() for f in guard.monitor._emitted]}, fh, default=str)
    tiny.reset_accelerate()


if __name__ == "__main__":
    tiny.run_scenarios(run)
