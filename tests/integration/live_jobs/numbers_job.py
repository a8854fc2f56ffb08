"""Two-rank Trainer runs whose logged numbers the guard's records are held against.

    torchrun --nproc_per_node 2 numbers_job.py OUT_DIR SCENARIO [SCENARIO ...]

Scenarios: `plain` (DDP over gloo, no DeepSpeed) and `zero2` (DeepSpeed ZeRO-2). Both log every step
(`logging_steps=1`), accumulate two micro-batches per optimizer step, clip hard (`max_grad_norm=0.05`, so
the norm before clipping differs from the one after), and warm the LR up from 0 and decay it (every step
its own LR). Every label is supervised (tiny.Tokens), so every rank's micro-batches hold as many tokens
and the Trainer's logged loss is the mean of the ranks' losses; GPT-2's loss divides by the Trainer's
token count, which in transformers 5.24 counts all 32 labels of a sequence, not the 31 it predicts.
Rank 0 writes the Trainer's `log_history` to OUT_DIR/SCENARIO/summary.json; every rank writes its
events file.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import tiny  # noqa: E402


def run(out_dir: str, name: str) -> None:
    from transformers import Trainer, TrainingArguments

    from lossguard import LossguardCallback

    work = os.path.join(out_dir, name)
    deepspeed = tiny.hf_ds_config(2) if name == "zero2" else None
    args = TrainingArguments(
        output_dir=os.path.join(work, "out"), per_device_train_batch_size=4, gradient_accumulation_steps=2,
        max_steps=8, learning_rate=1e-3, warmup_steps=3, lr_scheduler_type="linear", max_grad_norm=0.05,
        logging_steps=1, save_strategy="no", report_to=[], seed=0, deepspeed=deepspeed, use_cpu=True,
        disable_tqdm=True, dataloader_num_workers=0,
    )
    guard = LossguardCallback(events_dir=os.path.join(work, "events"), fingerprint_every=4)
    trainer = Trainer(model=tiny.tiny_gpt2(), args=args, train_dataset=tiny.Tokens(), callbacks=[guard])
    trainer.train()
    if tiny.rank() == 0:
        findings = [f.to_dict() for f in guard.monitor._emitted]
        with open(os.path.join(work, "summary.json"), "w") as fh:
            json.dump({"log_history": trainer.state.log_history, "findings": findings}, fh, default=str)
    tiny.reset_accelerate()


if __name__ == "__main__":
    tiny.run_scenarios(run)
