"""Two-rank DDP loop (gloo) with `lossguard.Guard(recover=True)`, `guard.batches(loader)` and
`guard.commit(..., forward=...)`, on the batch shapes real loops use: quarantine at micro-batch 1, and
batches that are a transformers `BatchEncoding` or a tuple.

    torchrun --nproc_per_node 2 quarantine_job.py OUT_DIR SCENARIO [SCENARIO ...]

Two epochs of a SIZE-sample dataset, DistributedSampler with shuffle (a new order each epoch, so a sample
meets other batch-mates, other padding, other steps), a model with dropout. Scenario names are
`SHAPE_CASE`: SHAPE `mb1` (one sample a rank a step, a dict with `index`), `tuple` (one sample, an
(ids, labels) tuple: nothing to mask, nothing to name it by but its tokens) or `enc` (two samples, a
`BatchEncoding` of right-padded `input_ids`, `attention_mask`, `labels` with -100 on the padding, no
index: what a transformers collator returns); CASE:
- `poison`: the embedding row of token POISON_TOKEN is 1e38 (finite; x4 overflows) and only sample
  POISON_INDEX carries that token.
- `masked`: every label of sample MASKED_INDEX is -100.
- `healthy`: no fault, recover=True; `plain`: the same run with no lossguard at all.
Every rank writes OUT_DIR/SCENARIO/rank{r}.json (losses, commits, the dataset indices each step saw where
the batch has them, how often the poisoned token reached the model, the batch types, the collectives) and
final-rank{r}.pt (its weights); rank 0 also summary.json.
"""

from __future__ import annotations

import json
import os
import sys

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

sys.path.insert(0, os.path.dirname(__file__))
import tiny  # noqa: E402
from recover_job import start  # noqa: E402

VOCAB, SEQ, SIZE, EPOCHS = 16, 8, 16, 2
POISON_TOKEN, POISON_INDEX, MASKED_INDEX = 15, 5, 6


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, 16)
        self.drop = torch.nn.Dropout(0.1)
        self.head = torch.nn.Linear(16, VOCAB)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor, attention_mask: torch.Tensor | None = None,
                index: torch.Tensor | None = None) -> torch.Tensor:
        logits = self.head(self.drop(self.emb(input_ids) * 4.0))  # a row of 1e38 overflows to inf here
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1))


class Data(Dataset):
    """Token ids below POISON_TOKEN, except sample POISON_INDEX which carries it; sample i is SEQ - i % 3
    tokens long (padded in `enc`)."""

    def __init__(self, case: str) -> None:
        self.ids = torch.randint(0, POISON_TOKEN, (SIZE, SEQ), generator=torch.Generator().manual_seed(7))
        self.ids[POISON_INDEX, 1] = POISON_TOKEN  # harmless unless the row is poisoned
        self.case = case

    def __len__(self) -> int:
        return SIZE

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = self.ids[i, : SEQ - i % 3]
        labels = ids.clone()
        if self.case == "masked" and i == MASKED_INDEX:
            labels[:] = -100
        return {"input_ids": ids, "labels": labels, "index": torch.tensor(i)}


def collate(shape: str):
    from transformers import BatchEncoding

    def mb1(items: list[dict]) -> dict:
        [item] = items
        return {k: v.unsqueeze(0) for k, v in item.items()}

    def as_tuple(items: list[dict]) -> tuple:
        [item] = items
        return item["input_ids"].unsqueeze(0), item["labels"].unsqueeze(0)

    def enc(items: list[dict]) -> BatchEncoding:
        width = max(len(item["input_ids"]) for item in items)
        pad = [width - len(item["input_ids"]) for item in items]
        return BatchEncoding({
            "input_ids": torch.stack([torch.nn.functional.pad(it["input_ids"], (0, n)) for it, n in zip(items, pad)]),
            "attention_mask": torch.stack([torch.nn.functional.pad(torch.ones_like(it["input_ids"]), (0, n))
                                           for it, n in zip(items, pad)]),
            "labels": torch.stack([torch.nn.functional.pad(it["labels"], (0, n), value=-100)
                                   for it, n in zip(items, pad)])})

    return {"mb1": mb1, "tuple": as_tuple, "enc": enc}[shape]


def run(out_dir: str, name: str) -> None:
    import lossguard

    shape, case = name.split("_")

    def make_net() -> Net:
        net = Net()
        if case == "poison":
            with torch.no_grad():
                net.emb.weight[POISON_TOKEN] = 1e38
        return net

    rank, work, model, optimizer = start(out_dir, name, make_net)
    counted = tiny.count_collectives()  # every rank must make the same collectives: counted from here
    guard = None if case == "plain" else lossguard.Guard(
        model, optimizer, events_dir=os.path.join(work, "events"), recover=True, fingerprint_every=4)
    data = Data(case)
    sampler = DistributedSampler(data, shuffle=True, seed=3)
    loader = DataLoader(data, batch_size=2 if shape == "enc" else 1, sampler=sampler, collate_fn=collate(shape))
    out: dict = {"losses": [], "commits": [], "seen": [], "poison_seen": 0, "types": []}

    def forward(batch) -> torch.Tensor:
        return model(*batch) if isinstance(batch, tuple) else model(**batch)

    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        for batch in (loader if guard is None else guard.batches(loader)):
            ids = batch[0] if isinstance(batch, tuple) else batch["input_ids"]
            out["types"].append(type(batch).__name__)
            out["poison_seen"] += int((ids == POISON_TOKEN).any())
            if isinstance(batch, dict) and "index" in batch:
                out["seen"].append(batch["index"].tolist())
            loss = forward(batch)
            loss.backward()
            out["losses"].append(loss.item())
            ok = True if guard is None else guard.commit(loss=loss, batch=batch, forward=forward)
            out["commits"].append(ok)
            if ok:
                optimizer.step()
            optimizer.zero_grad()
    if guard is not None:
        guard.close()
        out["steps_by_path"] = guard.monitor.steps_by_path
    out["collectives"] = tiny.collectives_since(counted)
    torch.save({k: v.clone() for k, v in model.module.state_dict().items()}, os.path.join(work, f"final-rank{rank}.pt"))
    with open(os.path.join(work, f"rank{rank}.json"), "w") as fh:
        json.dump(out, fh)
    if rank == 0:  # what run_job reads back: rank 0's findings
        with open(os.path.join(work, "summary.json"), "w") as fh:
            findings = [f.to_dict() for f in guard.monitor._emitted] if guard is not None else []
            json.dump({"findings": findings}, fh, default=str)


if __name__ == "__main__":
    tiny.run_scenarios(run)
