"""The live guard in a plain PyTorch loop (one process, or DDP under torchrun): `lossguard.Guard`.

    python examples/live_raw.py                          # one process, CPU
    torchrun --nproc_per_node 2 examples/live_raw.py     # two ranks, DDP over gloo
    python examples/live_raw.py --nan-at 5               # a NaN loss at step 5: halted, saved, exit status 3

A two-layer next-token model learns to count; no download, no framework beyond torch.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

import lossguard

VOCAB, SEQ = 96, 32


class Counter(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 64)
        self.head = torch.nn.Linear(64, VOCAB)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.head(torch.relu(self.embed(input_ids)))
        return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1), ignore_index=-100)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="runs/live_raw")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--nan-at", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = Counter()
    if "RANK" in os.environ:  # started by torchrun
        dist.init_process_group("gloo")
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    guard = lossguard.Guard(model, optimizer, events_dir=f"{args.out}/events", halt_on="broken",
                            exit_code_on_halt=3)
    try:
        for step in range(1, args.steps + 1):
            ids = (torch.randint(0, VOCAB, (8, 1)) + torch.arange(SEQ)) % VOCAB
            batch = {"input_ids": ids, "labels": ids}
            loss = model(**batch)
            if step == args.nan_at:  # demo only: a NaN loss at that step
                loss = loss * float("nan")
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # the norm before clipping
            optimizer.step()
            optimizer.zero_grad()
            guard.step(loss=loss, batch=batch, grad_norm=grad_norm)  # LossguardHalt on every rank together
    except lossguard.LossguardHalt as halt:
        if not dist.is_initialized() or dist.get_rank() == 0:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": halt.step},
                       f"{args.out}/halt-step{halt.step}.pt")
    guard.close()  # after a halt: every rank waits for the others (the save above), then SystemExit(3)
    if dist.is_initialized():
        dist.destroy_process_group()

if __name__ == "__main__":
    main()
