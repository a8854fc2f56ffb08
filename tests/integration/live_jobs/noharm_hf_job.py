"""Two-rank healthy but unusual runs (CPU, gloo) under `transformers.Trainer` with and without DeepSpeed, and
under a raw DeepSpeed engine, each with and without lossguard's recovery (issue 32, the do-no-harm suite).

    torchrun --nproc_per_node 2 noharm_hf_job.py OUT_DIR SCENARIO [SCENARIO ...]

Scenario names: STACK-CASE-ARM. STACK: `ddp` (the Trainer without DeepSpeed), `z2` (the Trainer under
DeepSpeed ZeRO-2) or `attach` (a raw ZeRO-2 engine and its own loop, `lossguard.attach`). ARM: `plain` (no
lossguard) or `recover` (`LossguardCallback(recover=True)`, or `attach(engine, recover=True)`). CASE (every
one trains STEPS optimizer steps of an easy task, each token's successor the next token, then from SHIFT_AT a
harder one, a different successor map: the loss leaps far above the run's spread while the gradient norm
stays about what it was at the start, and stays high while the run learns the new task):
  shift  four sequences a rank a step;
  ga4    gradient accumulation over 4 micro-batches of two sequences;
  mb1    one sequence a rank a step;
  enc    a collator that returns a `transformers.BatchEncoding` of right-padded `input_ids`,
         `attention_mask` and `labels` (-100 on the padding), sequences of three lengths.
The model is a bigram LM (an embedding and a head) that learns the easy task within the first steps, so the
switch is a leap far above the gate's loss limit. Each rank counts the sequences it has been handed, so the
switch comes at the same optimizer step in every arm whatever the loader prefetches.
Every rank writes OUT_DIR/SCENARIO/rank{r}.json (each micro-batch's loss as the model computed it, the
optimizer steps taken, the halt) and final-rank{r}.pt (its weights); rank 0 writes summary.json.
"""

from __future__ import annotations

import json
import os
import sys

import torch
from torch.utils.data import Dataset

sys.path.insert(0, os.path.dirname(__file__))
import tiny  # noqa: E402

VOCAB, SEQ, STEPS, SHIFT_AT, LR = 16, 8, 28, 22, 3e-2
MICRO = {"shift": 4, "ga4": 2, "mb1": 1, "enc": 4}
ACCUMULATE = {"ga4": 4}


class BigramLM(torch.nn.Module):
    """An embedding and a head; the Trainer's contract: keyword tensors in, `{"loss": ...}` out."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(VOCAB, 16)
        self.head = torch.nn.Linear(16, VOCAB)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor,
                attention_mask: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        logits = self.head(self.emb(input_ids))
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1))
        return {"loss": loss}


def sequence(seed: int, hard: bool, length: int = SEQ) -> torch.Tensor:
    """A sequence of the easy successor map (t -> t + 1) or the hard one (t -> 5t + 3)."""
    ids = torch.empty(length, dtype=torch.long)
    ids[0] = int(torch.randint(0, VOCAB, (1,), generator=torch.Generator().manual_seed(seed)))
    for t in range(1, length):
        ids[t] = (5 * ids[t - 1] + 3) % VOCAB if hard else (ids[t - 1] + 1) % VOCAB
    return ids


class Shifting(Dataset):
    """512 seeds (one epoch covers every case's steps); the n-th sequence this process hands out is of the hard task once n reaches the first
    micro-batch of optimizer step SHIFT_AT. In `enc`, sample i is SEQ - i % 3 tokens long."""

    def __init__(self, case: str) -> None:
        self.case, self.served = case, 0
        self.switch = (SHIFT_AT - 1) * MICRO[case] * ACCUMULATE.get(case, 1)

    def __len__(self) -> int:
        return 512

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        hard = self.served >= self.switch
        self.served += 1
        ids = sequence(1000 + i, hard, SEQ - i % 3 if self.case == "enc" else SEQ)
        return {"input_ids": ids, "labels": ids.clone()}


def collate(case: str):
    from transformers import BatchEncoding

    def stacked(items: list[dict]) -> dict:
        return {key: torch.stack([item[key] for item in items]) for key in items[0]}

    def encoded(items: list[dict]) -> BatchEncoding:
        width = max(len(item["input_ids"]) for item in items)
        pad = [width - len(item["input_ids"]) for item in items]
        return BatchEncoding({
            "input_ids": torch.stack([torch.nn.functional.pad(it["input_ids"], (0, n)) for it, n in zip(items, pad)]),
            "attention_mask": torch.stack([torch.nn.functional.pad(torch.ones_like(it["input_ids"]), (0, n))
                                           for it, n in zip(items, pad)]),
            "labels": torch.stack([torch.nn.functional.pad(it["labels"], (0, n), value=-100)
                                   for it, n in zip(items, pad)])})

    return encoded if case == "enc" else stacked


def ds_config(case: str) -> dict:
    config = tiny.ds_config(2, micro=MICRO[case], ga=ACCUMULATE.get(case, 1), lr=LR)
    config["gradient_clipping"] = 0.0  # the Trainer's max_grad_norm=0 too: no clipping in any arm
    config["scheduler"] = {"type": "WarmupLR", "params": {"warmup_min_lr": LR, "warmup_max_lr": LR,
                                                          "warmup_num_steps": 1}}  # a constant LR
    return config


def run(out_dir: str, name: str) -> None:
    stack, case, arm = name.split("-")
    work = os.path.join(out_dir, name)
    os.makedirs(work, exist_ok=True)
    (run_attach if stack == "attach" else run_trainer)(work, stack, case, arm)


def run_trainer(work: str, stack: str, case: str, arm: str) -> None:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    import lossguard

    rank, model = tiny.rank(), BigramLM()
    losses: list[float] = []

    def record(module, args, kwargs, output):  # each training micro-batch's loss, as the model computed it
        if module.training:
            losses.append(float(output["loss"].detach()))
        return output

    model.register_forward_hook(record, with_kwargs=True)
    weights: dict = {}

    class Final(TrainerCallback):
        def on_train_end(self, args, state, control, model=None, **kwargs):
            weights.update({k: v.detach().clone() for k, v in model.state_dict().items()})

    guard = None
    callbacks = [Final()]
    if arm == "recover":
        guard = lossguard.LossguardCallback(events_dir=os.path.join(work, "events"), recover=True)
        callbacks.append(guard)
    deepspeed = None
    if stack == "z2":
        deepspeed = tiny.hf_ds_config(2)
        deepspeed["gradient_clipping"] = "auto"
    else:  # a DeepSpeed scenario before this one left accelerate's switch on
        os.environ.pop("ACCELERATE_USE_DEEPSPEED", None)
    args = TrainingArguments(
        output_dir=os.path.join(work, "out"), per_device_train_batch_size=MICRO[case],
        gradient_accumulation_steps=ACCUMULATE.get(case, 1), max_steps=STEPS, learning_rate=LR,
        lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=0.0, logging_steps=1, save_strategy="no",
        report_to=[], seed=0, deepspeed=deepspeed, use_cpu=True, disable_tqdm=True, dataloader_num_workers=0)
    trainer = Trainer(model=model, args=args, train_dataset=Shifting(case), data_collator=collate(case),
                      callbacks=callbacks)
    trainer.train()
    torch.save(weights, os.path.join(work, f"final-rank{rank}.pt"))
    write(work, rank, {"losses": losses, "global_step": trainer.state.global_step,
                       "halted_at": guard.monitor.halted_at if guard else None}, guard.monitor if guard else None)
    tiny.reset_accelerate()


def run_attach(work: str, stack: str, case: str, arm: str) -> None:
    """The raw engine's own loop: `engine(**batch)`, `engine.backward`, `engine.step`, over the data the
    Trainer would have given this rank (a DistributedSampler without shuffling)."""
    import deepspeed
    from torch.utils.data import DataLoader, DistributedSampler

    import lossguard

    rank, model = tiny.rank(), BigramLM()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config(case))
    guard = lossguard.attach(engine, events_dir=os.path.join(work, "events"), recover=True) if arm == "recover" \
        else None
    data = Shifting(case)
    loader = DataLoader(data, batch_size=MICRO[case], sampler=DistributedSampler(data, shuffle=False),
                        collate_fn=collate(case))
    losses, halted = [], None
    micro = iter(loader)
    try:
        for _ in range(STEPS * ACCUMULATE.get(case, 1)):
            loss = engine(**next(micro))["loss"]
            losses.append(float(loss))
            engine.backward(loss)
            engine.step()
    except lossguard.LossguardHalt as halt:
        halted = halt.step
    monitor = guard.monitor if guard else None
    if guard is not None:
        guard.detach()
    torch.save({k: v.detach().clone() for k, v in engine.module.state_dict().items()},
               os.path.join(work, f"final-rank{rank}.pt"))
    write(work, rank, {"losses": losses, "global_step": engine.global_steps, "halted_at": halted}, monitor)
    engine.destroy() if hasattr(engine, "destroy") else None


def write(work: str, rank: int, out: dict, monitor) -> None:
    with open(os.path.join(work, f"rank{rank}.json"), "w") as fh:
        json.dump(out, fh)
    if rank == 0:
        findings = [f.to_dict() for f in monitor._emitted] if monitor is not None else []
        with open(os.path.join(work, "summary.json"), "w") as fh:
            json.dump({"findings": findings}, fh, default=str)


if __name__ == "__main__":
    tiny.run_scenarios(run)
