"""The live guard in TRL's `SFTTrainer`: a `transformers.Trainer` subclass, so `LossguardCallback` is all it takes.

    python examples/live_trl.py                  # one process, CPU
    python examples/live_trl.py --nan-at 5       # a NaN loss at step 5: halted, checkpointed, exit status 3
    python examples/live_trl.py --explode-at 5   # the learning rate explodes at step 5
    lossguard watch --halt-on broken -- python examples/live_trl.py --nan-at 5 --no-guard   # watch alone

Everything is built here, nothing is downloaded: a word-level tokenizer, a tiny GPT-2 from a config and a
dataset of short sentences (`datasets.Dataset.from_list`). With `logging_steps=1` the Trainer prints every
step's log dict, which `lossguard watch` reads.
"""

from __future__ import annotations

import argparse
import random

import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast, TrainerCallback
from trl import SFTConfig, SFTTrainer

from lossguard import LossguardCallback

SUBJECTS, VERBS, PREPOSITIONS, PLACES = ["cat", "dog", "bird"], ["sat", "ran", "flew"], ["on", "to", "over"], \
    ["mat", "park", "tree"]
WORDS = ["the", *SUBJECTS, *VERBS, *PREPOSITIONS, *PLACES]


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"[PAD]": 0, "[UNK]": 1, "[EOS]": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]",
                                   eos_token="[EOS]")


def sentences(n: int = 64) -> Dataset:
    rng = random.Random(0)
    return Dataset.from_list([{"text": f"the {rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(PREPOSITIONS)} "
                                       f"the {rng.choice(PLACES)}"} for _ in range(n)])


def poison_loss_at(model: torch.nn.Module, step: int) -> None:
    """Demo only: the `step`-th training forward's embeddings become NaN, and so its loss. (Poisoning the model's
    `output.loss` would not do: SFTTrainer computes the loss it trains on from the model's log-probs itself.)"""
    calls = [0]

    def hook(module, args, output):
        calls[0] += module.training
        if module.training and calls[0] == step:
            return output * float("nan")
        return None

    model.get_input_embeddings().register_forward_hook(hook)


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
    parser.add_argument("--out", default="runs/live_trl")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--nan-at", type=int, default=0, help="demo: a NaN loss at this step")
    parser.add_argument("--explode-at", type=int, default=0, help="demo: the learning rate explodes at this step")
    parser.add_argument("--no-guard", action="store_true", help="no guard (to try `lossguard watch` alone)")
    args = parser.parse_args()

    tokenizer = tiny_tokenizer()
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_positions=16, n_embd=32, n_layer=2, n_head=2,
                                       bos_token_id=2, eos_token_id=2, pad_token_id=0))
    if args.nan_at:
        poison_loss_at(model, args.nan_at)
    guard = LossguardCallback(events_dir=f"{args.out}/events", halt_on="broken", exit_code_on_halt=3)
    callbacks = [] if args.no_guard else [guard]
    if args.explode_at:
        callbacks.append(ExplodeLR(args.explode_at))
    config = SFTConfig(output_dir=f"{args.out}/trainer", max_steps=args.steps, learning_rate=1e-3, max_length=16,
                       per_device_train_batch_size=4, logging_steps=1, save_strategy="no", report_to=[],
                       use_cpu=True, disable_tqdm=True)
    trainer = SFTTrainer(model=model, args=config, train_dataset=sentences(), processing_class=tokenizer,
                         callbacks=callbacks)
    trainer.train()  # on a halt: checkpoint-N saved in output_dir, then SystemExit(3)
    trainer.save_model(f"{args.out}/final")  # reached only by a run that did not halt


if __name__ == "__main__":
    main()
