"""The live guard in a Hugging Face Trainer: `LossguardCallback`.

    python examples/live_hf.py                          # one process, CPU, a few seconds
    torchrun --nproc_per_node 2 examples/live_hf.py     # two ranks (DDP); DeepSpeed: TrainingArguments(deepspeed=...)
    python examples/live_hf.py --nan-at 5               # a NaN loss at step 5: halted, checkpointed, exit status 3
    python examples/live_hf.py --explode-at 5           # the learning rate explodes at step 5
    lossguard watch --halt-on broken -- python examples/live_hf.py --nan-at 5 --no-guard   # watch alone

A tiny GPT-2 built from a config (no download) learns to count on CPU. The guard writes
OUT/events/events-rank{r}.jsonl (`lossguard analyze OUT/events` reads it back). With `logging_steps=1` the
Trainer prints every step's log dict, which `lossguard watch` reads.
"""

from __future__ import annotations

import argparse

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from lossguard import LossguardCallback


def counting_data(n: int = 64, seq: int = 32, vocab: int = 96) -> list[dict]:
    starts = torch.randint(0, vocab, (n, 1), generator=torch.Generator().manual_seed(0))
    return [{"input_ids": ids, "labels": ids} for ids in (starts + torch.arange(seq)) % vocab]


def poison_loss_at(model: torch.nn.Module, step: int) -> None:
    """Demo only: the loss of the `step`-th training forward becomes NaN."""
    calls = [0]

    def hook(module, args, output):
        calls[0] += module.training
        if module.training and calls[0] == step:
            output.loss = output.loss * float("nan")

    model.register_forward_hook(hook)


class ExplodeLR(TrainerCallback):
    """Demo only: from the `step`-th optimizer step on, the learning rate is 1000x what the schedule says."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_begin(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
        if state.global_step + 1 == self.step:  # global_step counts the steps done
            lr_scheduler.base_lrs = [lr * 1e3 for lr in lr_scheduler.base_lrs]  # the steps after this one
            for group in optimizer.param_groups:  # this one
                group["lr"] *= 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="runs/live_hf")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--nan-at", type=int, default=0, help="demo: a NaN loss at this step")
    parser.add_argument("--explode-at", type=int, default=0, help="demo: the learning rate explodes at this step")
    parser.add_argument("--no-guard", action="store_true", help="no guard (to try `lossguard watch` alone)")
    args = parser.parse_args()

    model = GPT2LMHeadModel(GPT2Config(vocab_size=96, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                                       bos_token_id=0, eos_token_id=0))
    if args.nan_at:
        poison_loss_at(model, args.nan_at)
    # halt_on="broken": checkpoint and stop on every rank when the run is broken (NaN, no gradient, ...);
    # exit_code_on_halt=3: then the script exits 3, so the launcher and the scheduler see a failure.
    guard = LossguardCallback(events_dir=f"{args.out}/events", halt_on="broken", exit_code_on_halt=3)
    callbacks = [] if args.no_guard else [guard]
    if args.explode_at:
        callbacks.append(ExplodeLR(args.explode_at))
    training = TrainingArguments(output_dir=f"{args.out}/trainer", max_steps=args.steps, learning_rate=1e-3,
                                 per_device_train_batch_size=4, logging_steps=1, save_strategy="no", report_to=[],
                                 use_cpu=True, disable_tqdm=True)
    trainer = Trainer(model=model, args=training, train_dataset=counting_data(), callbacks=callbacks)
    trainer.train()  # on a halt: checkpoint-N saved in output_dir, then SystemExit(3) on every rank
    trainer.save_model(f"{args.out}/final")  # reached only by a run that did not halt


if __name__ == "__main__":
    main()
