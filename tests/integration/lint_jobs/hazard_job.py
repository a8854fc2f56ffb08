"""Two-rank Trainer + DeepSpeed (CPU, gloo, bf16 ZeRO-2) runs that show what DSC115 and DSC116 claim.

    torchrun --nproc_per_node 2 hazard_job.py OUT_DIR SCENARIO [SCENARIO ...]

clip-absent / clip-auto: SGD at lr 1 with --max_grad_norm 1e-3, one step, with and without a
`gradient_clipping` key; rank 0 writes the engine's clip value and the size of the weight update.
sched-deepspeed / sched-trainer: --lr_scheduler_type cosine over 8 steps, with and without a DeepSpeed
WarmupLR block; rank 0 writes the logged learning rate of every step.
"""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "live_jobs"))
import tiny  # noqa: E402

MAX_GRAD_NORM = 1e-3


def ds_config(name: str) -> dict:
    config = tiny.hf_ds_config(2, bf16=True)
    config["zero_allow_untested_optimizer"] = True  # torch SGD under ZeRO
    if name == "clip-absent":
        del config["gradient_clipping"]
    if name == "sched-deepspeed":
        config["scheduler"] = {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": "auto",
                                                              "warmup_num_steps": "auto", "warmup_type": "linear"}}
    return config


def flat_weights(model) -> torch.Tensor:
    return torch.cat([p.detach().float().reshape(-1).clone() for p in model.parameters()])


def run(out_dir: str, name: str) -> None:
    from transformers import Trainer, TrainingArguments

    work = os.path.join(out_dir, name)
    clip_run = name.startswith("clip")
    args = TrainingArguments(
        output_dir=os.path.join(work, "out"), per_device_train_batch_size=4, max_steps=1 if clip_run else 8,
        learning_rate=1.0 if clip_run else 1e-3, optim="sgd" if clip_run else "adamw_torch",
        max_grad_norm=MAX_GRAD_NORM if clip_run else 1.0, lr_scheduler_type="constant" if clip_run else "cosine",
        warmup_steps=0 if clip_run else 2, logging_steps=1, save_strategy="no", report_to=[], seed=0, bf16=True,
        deepspeed=ds_config(name), use_cpu=True, disable_tqdm=True, dataloader_num_workers=0,
    )
    model = tiny.tiny_gpt2()
    before = flat_weights(model)
    trainer = Trainer(model=model, args=args, train_dataset=tiny.Tokens())
    trainer.train()
    summary = {"scenario": name, "global_step": trainer.state.global_step, "config": ds_config(name),
               "learning_rates": [row["learning_rate"] for row in trainer.state.log_history if "learning_rate" in row],
               "grad_norms": [row["grad_norm"] for row in trainer.state.log_history if "grad_norm" in row]}
    if clip_run:
        engine = trainer.model_wrapped
        summary["engine_clipping"] = float(engine.gradient_clipping())
        summary["update_norm"] = float((flat_weights(engine.module) - before).norm())
    if tiny.rank() == 0:
        os.makedirs(work, exist_ok=True)
        with open(os.path.join(work, "summary.json"), "w") as fh:
            json.dump(summary, fh)
    tiny.reset_accelerate()


if __name__ == "__main__":
    tiny.run_scenarios(run)
