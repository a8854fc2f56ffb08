"""The live guard in a hand-written 🤗 Accelerate loop: `lossguard.Guard`.

    python examples/live_accelerate.py                         # one process, CPU
    torchrun --nproc_per_node 2 examples/live_accelerate.py       # two ranks over gloo (as `accelerate launch` starts them)
    python examples/live_accelerate.py --nan-at 5              # a NaN loss at step 5: halted, saved, exit status 3
    python examples/live_accelerate.py --explode-at 5          # the learning rate explodes at step 5
    lossguard watch --halt-on broken -- python examples/live_accelerate.py --nan-at 5 --no-guard   # watch alone

A tiny GPT-2 built from a config (no download) learns to count on CPU. Each step prints a line
`step 5 loss 4.457 grad_norm 0.8932 lr 0.001` that `lossguard analyze` and `lossguard watch` read.
"""

from __future__ import annotations

import argparse
import contextlib

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader
from transformers import GPT2Config, GPT2LMHeadModel

import lossguard

EXPLODE = 1e3  # demo only: --explode-at multiplies the learning rate by this


def counting_data(n: int = 64, seq: int = 32, vocab: int = 96) -> list[dict]:
    starts = torch.randint(0, vocab, (n, 1), generator=torch.Generator().manual_seed(0))
    return [{"input_ids": ids, "labels": ids} for ids in (starts + torch.arange(seq)) % vocab]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="runs/live_accelerate")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--nan-at", type=int, default=0, help="demo: a NaN loss at this step")
    parser.add_argument("--explode-at", type=int, default=0, help="demo: the learning rate explodes at this step")
    parser.add_argument("--no-guard", action="store_true", help="no guard (to try `lossguard watch` alone)")
    args = parser.parse_args()

    accelerator = Accelerator(cpu=True)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=96, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                                       bos_token_id=0, eos_token_id=0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(counting_data(4 * args.steps), batch_size=4, shuffle=True)  # one epoch: --steps batches
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    # Created after `prepare`, on every process. exit_code_on_halt=3: leaving the `with` block after a halt
    # raises SystemExit(3) on every rank.
    guarded = contextlib.nullcontext() if args.no_guard else \
        lossguard.Guard(model, optimizer, events_dir=f"{args.out}/events", halt_on="broken", exit_code_on_halt=3)
    with guarded as guard:
        try:
            for step, batch in enumerate(loader, start=1):
                loss = model(**batch).loss
                if step == args.nan_at:  # demo only: a NaN loss at that step
                    loss = loss * float("nan")
                accelerator.backward(loss)
                grad_norm = accelerator.clip_grad_norm_(model.parameters(), 1.0)  # the norm before clipping
                if step == args.explode_at:  # demo only: from that step on, the learning rate is far too high
                    for group in optimizer.param_groups:
                        group["lr"] *= EXPLODE
                optimizer.step()
                optimizer.zero_grad()
                # The log line, on the main process (.item() waits for the device: a real loop prints every N)
                accelerator.print(f"step {step} loss {loss.item():.5g} grad_norm {grad_norm.item():.4g} "
                                  f"lr {optimizer.param_groups[0]['lr']:.4g}", flush=True)
                if guard is not None:
                    guard.step(loss=loss, batch=batch, grad_norm=grad_norm)  # LossguardHalt on every rank together
                if step == args.steps:
                    break
        except lossguard.LossguardHalt as halt:
            accelerator.save_state(f"{args.out}/halt-step{halt.step}")  # collective: every rank is here
    accelerator.save_state(f"{args.out}/final")  # reached only by a run that did not halt


if __name__ == "__main__":
    main()
