"""The live guard in a plain PyTorch loop (one process, or DDP under torchrun): `lossguard.Guard`.

    python examples/live_raw.py                          # one process, CPU
    torchrun --nproc_per_node 2 examples/live_raw.py     # two ranks, DDP over gloo
    python examples/live_raw.py --nan-at 5               # a NaN loss at step 5: halted, saved, exit status 3
    python examples/live_raw.py --explode-at 5           # the learning rate explodes at step 5: the loss diverges
    lossguard watch --halt-on broken -- python examples/live_raw.py --nan-at 5 --no-guard   # watch alone

A two-layer next-token model learns to count; no download, no framework beyond torch. Each step prints a line
`step 5 loss 3.679 grad_norm 0.5172 lr 0.01` that `lossguard analyze` and `lossguard watch` read.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

import lossguard

VOCAB, SEQ = 96, 32
EXPLODE = 1e5  # demo only: the --explode-at LR factor (at 1e3 this two-layer model bounces back and learns)


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
    parser.add_argument("--nan-at", type=int, default=0, help="demo: a NaN loss at this step")
    parser.add_argument("--explode-at", type=int, default=0, help="demo: the learning rate explodes at this step")
    parser.add_argument("--no-guard", action="store_true", help="no guard (to try `lossguard watch` alone)")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = Counter()
    if "RANK" in os.environ:  # started by torchrun
        dist.init_process_group("gloo")
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    guard = None if args.no_guard else lossguard.Guard(model, optimizer, events_dir=f"{args.out}/events",
                                                       halt_on="broken", exit_code_on_halt=3)
    rank0 = not dist.is_initialized() or dist.get_rank() == 0
    try:
        for step in range(1, args.steps + 1):
            ids = (torch.randint(0, VOCAB, (8, 1)) + torch.arange(SEQ)) % VOCAB
            batch = {"input_ids": ids, "labels": ids}
            loss = model(**batch)
            if step == args.nan_at:  # demo only: a NaN loss at that step
                loss = loss * float("nan")
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # the norm before clipping
            if step == args.explode_at:  # demo only: from that step on, the learning rate is far too high
                for group in optimizer.param_groups:
                    group["lr"] *= EXPLODE
            optimizer.step()
            optimizer.zero_grad()
            if rank0:  # the log line (.item() waits for the device: a real loop prints every N steps)
                print(f"step {step} loss {loss.item():.5g} grad_norm {grad_norm.item():.4g} "
                      f"lr {optimizer.param_groups[0]['lr']:.4g}", flush=True)
            if guard is not None:
                guard.step(loss=loss, batch=batch, grad_norm=grad_norm)  # LossguardHalt on every rank together
    except lossguard.LossguardHalt as halt:
        if rank0:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": halt.step},
                       f"{args.out}/halt-step{halt.step}.pt")
    if guard is not None:
        guard.close()  # after a halt: every rank waits for the others (the save above), then SystemExit(3)
    if dist.is_initialized():
        dist.destroy_process_group()

if __name__ == "__main__":
    main()
