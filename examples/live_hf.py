"""The live guard in a Hugging Face Trainer: `LossguardCallback`.

    python examples/live_hf.py                          # one process, CPU, a few seconds
    torchrun --nproc_per_node 2 examples/live_hf.py     # two ranks (DDP); DeepSpeed: TrainingArguments(deepspeed=...)
    python examples/live_hf.py --nan-at 5               # a NaN loss at step 5: halted, checkpointed, exit status 3

A tiny GPT-2 built from a config (no download) learns to count on CPU. The guard writes
OUT/events/events-rank{r}.jsonl (`lossguard analyze OUT/events` reads it back).
"""

from __future__ import annotations

import argparse

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="runs/live_hf")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--nan-at", type=int, default=0)
    args = parser.parse_args()

    model = GPT2LMHeadModel(GPT2Config(vocab_size=96, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                                       bos_token_id=0, eos_token_id=0))
    if args.nan_at:
        poison_loss_at(model, args.nan_at)
    # halt_on="broken": checkpoint and stop on every rank when the run is broken (NaN, no gradient, ...);
    # exit_code_on_halt=3: then the script exits 3, so the launcher and the scheduler see a failure.
    guard = LossguardCallback(events_dir=f"{args.out}/events", halt_on="broken", exit_code_on_halt=3)
    training = TrainingArguments(output_dir=f"{args.out}/trainer", max_steps=args.steps, learning_rate=1e-3,
                                 per_device_train_batch_size=4, logging_steps=5, save_strategy="no", report_to=[],
                                 use_cpu=True, disable_tqdm=True)
    trainer = Trainer(model=model, args=training, train_dataset=counting_data(), callbacks=[guard])
    trainer.train()  # on a halt: checkpoint-N saved in output_dir, then SystemExit(3) on every rank
    trainer.save_model(f"{args.out}/final")  # reached only by a run that did not halt


if __name__ == "__main__":
    main()
