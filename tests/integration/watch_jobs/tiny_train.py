"""A real two-rank fine-tuning job for the `watch` tests: a tiny GPT-2 trained for real on CPU.

    torchrun --nproc_per_node 2 tiny_train.py trainer [--masked] [--nan-once] [--steps N] [--logging-steps N]
    torchrun --nproc_per_node 2 tiny_train.py raw --inf-step K [--steps N]

`trainer`: `transformers.Trainer` + DeepSpeed ZeRO-2. `--masked` sets every label to -100: the run logs
`{'loss': '0', 'grad_norm': '0', ...}` from its first log. `--nan-once`: rank 1's loss is NaN on the first
attempt of step K (`--inf-step`) only, a fault a replay does not meet again.
`raw`: `deepspeed.initialize`, bf16 ZeRO-2 with `check_grad_overflow: false`; at step K rank 1 multiplies its
loss by inf, the averaged gradient is inf, Adam writes NaN into the weights and every later loss is NaN.
Rank 0 prints a Trainer-style dict per step, like a hand-written loop does.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402

VOCAB, SEQ, MICRO_BATCH = 96, 32, 4


def tiny_model():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2,
                        bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


def dataset(num_samples: int, masked: bool) -> list[dict]:
    generator = torch.Generator().manual_seed(1)
    out = []
    for _ in range(num_samples):
        # A learnable pattern: a random start token followed by +1 increments modulo the vocabulary.
        start = int(torch.randint(0, VOCAB, (1,), generator=generator))
        ids = (torch.arange(SEQ) + start) % VOCAB
        labels = torch.full_like(ids, -100) if masked else ids.clone()
        out.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels})
    return out


def collate(batch: list[dict]) -> dict:
    return {k: torch.stack([b[k] for b in batch]) for k in batch[0]}


def ds_config(stage: int, bf16: bool) -> dict:
    config = {"train_micro_batch_size_per_gpu": MICRO_BATCH, "gradient_accumulation_steps": 1,
              "zero_optimization": {"stage": stage}, "gradient_clipping": 1.0, "steps_per_print": 1000}
    if bf16:
        config["bf16"] = {"enabled": True, "check_grad_overflow": False}
    return config


def run_trainer(args) -> None:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    now = {"step": 0, "fired": False}

    class StepTime(TrainerCallback):
        def on_step_begin(self, _args, state, *_rest, **_kwargs):
            now["step"] = state.global_step + 1

        def on_step_end(self, *_args, **_kwargs):
            time.sleep(args.step_sleep)

    def nan_once(module, _inputs, output):  # the first attempt of step K on rank 1 only: a replay runs clean
        rank = int(os.environ.get("RANK", "0"))
        if args.nan_once and module.training and rank == 1 and now["step"] == args.inf_step and not now["fired"]:
            now["fired"] = True
            output.loss = output.loss * float("nan")
        return output

    config = ds_config(stage=2, bf16=False)
    config["train_micro_batch_size_per_gpu"] = "auto"
    config["gradient_accumulation_steps"] = "auto"
    config["gradient_clipping"] = "auto"
    config["optimizer"] = {"type": "AdamW", "params": {"lr": "auto", "torch_adam": True}}
    training_args = TrainingArguments(
        output_dir=args.out, per_device_train_batch_size=MICRO_BATCH, max_steps=args.steps,
        learning_rate=1e-3, warmup_steps=2, logging_steps=args.logging_steps, save_strategy="no",
        report_to=[], seed=0, dataloader_num_workers=0, use_cpu=True, deepspeed=config)
    model = tiny_model()
    model.register_forward_hook(nan_once)
    trainer = Trainer(model=model, args=training_args,
                      train_dataset=dataset(64, args.masked), data_collator=collate, callbacks=[StepTime()])
    trainer.train()


def run_raw(args) -> None:
    import deepspeed
    from torch.utils.data import DataLoader, DistributedSampler

    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    config = ds_config(stage=2, bf16=True)
    config["optimizer"] = {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}
    model = tiny_model()
    engine, _, _, _ = deepspeed.initialize(model=model, config=config, model_parameters=model.parameters())
    data = dataset(64, masked=False)
    loader = DataLoader(data, batch_size=MICRO_BATCH, collate_fn=collate,
                        sampler=DistributedSampler(data, num_replicas=world, rank=rank, seed=0))
    step = 0
    while step < args.steps:
        for batch in loader:
            step += 1
            batch = {k: v.to(engine.device) for k, v in batch.items()}
            loss = engine(**batch).loss
            if step == args.inf_step and rank == world - 1:
                loss = loss * float("inf")  # the fault: one non-finite loss, on one rank, once
            engine.backward(loss)
            engine.step()
            time.sleep(args.step_sleep)
            grad_norm = engine.get_global_grad_norm()
            grad_norm = float("nan") if grad_norm is None else float(grad_norm)
            if rank == 0:
                lr = engine.get_lr()[0]
                print({"loss": f"{loss.item():.4g}", "grad_norm": f"{grad_norm:.4g}",
                       "learning_rate": f"{lr:.4g}", "step": step})
            if step >= args.steps:
                break


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["trainer", "raw"])
    parser.add_argument("--masked", action="store_true")
    parser.add_argument("--nan-once", action="store_true")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--logging-steps", type=int, default=1)
    parser.add_argument("--inf-step", type=int, default=5)
    # Seconds added to every step: a realistic step time, so "one logging interval" is longer than a
    # signal's round trip through torchrun (the tiny model alone takes ~50 ms a step).
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--out", default=os.environ.get("TMPDIR", "/tmp") + "/tiny_train_out")
    args = parser.parse_args()
    run_trainer(args) if args.mode == "trainer" else run_raw(args)
    # Close the process group before exit: left to interpreter exit, torch 2.13 + gloo on CPU now and then
    # aborts a rank after the last step ("terminate called without an active exception").
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
