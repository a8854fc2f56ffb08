"""Two-rank DDP loop (gloo) with `lossguard.Guard(recover=True)`, `guard.batches(loader)` and
`guard.commit(..., forward=...)`: a held step is replayed and classified.

    torchrun --nproc_per_node 2 replay_job.py OUT_DIR SCENARIO [SCENARIO ...]

Scenarios (two epochs of a 32-sample dataset, DistributedSampler without shuffle, 4 samples a batch: 8 steps;
the model has dropout, so the replay's RNG restore matters):
- `clean`: no fault.
- `transient`: rank 1's loss is NaN on the first attempt of step TRANSIENT_STEP only (the replay is clean).
- `poison`: the embedding row of token POISON_TOKEN is set to 1e38 (finite, but x4 overflows) and only
  dataset sample POISON_INDEX contains that token (rank 1's batch at step 2).
- `resume`: a new run with a new Guard on `poison`'s events dir (its quarantine file).
- `all_bad`: the same poisoned row, carried by every sample of rank 1's batch at step 2 (and 6): the state,
  not one sample, is at fault: held.
- `masked`: every label of the samples in rank 0's batch at step 3 is -100.
- `replay_oom`: as `transient`, but the replay's forward raises on rank 1 only (an out-of-memory error
  inside the model, as on a device short of memory): no rank may enter the backward's all-reduce without the
  others; every rank holds the step, and the run goes on. Run alone with a short process-group timeout
  (LOSSGUARD_TEST_PG_TIMEOUT_S), so that a hang fails within seconds.
Every rank writes OUT_DIR/SCENARIO/rank{r}.json (losses, commits, the dataset indices each step saw, how many
times `forward` was called, the collectives) and final-rank{r}.pt (its weights); rank 0 also summary.json.
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

VOCAB, SEQ, SIZE, EPOCHS = 16, 8, 32, 2
TRANSIENT_STEP, POISON_TOKEN, POISON_INDEX, MASKED, ALL_BAD = 4, 15, 13, {16, 18, 20, 22}, [9, 11, 13, 15]


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, 16)
        self.drop = torch.nn.Dropout(0.1)
        self.head = torch.nn.Linear(16, VOCAB)
        self.fail_next = False  # `replay_oom`: the next forward raises, as an out-of-memory error would

    def forward(self, ids: torch.Tensor, labels: torch.Tensor, index: torch.Tensor | None = None) -> torch.Tensor:
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("out of memory (simulated, replay_oom)")
        # the embedding scaled by sqrt(width), as Gemma does: a row of 1e38 overflows to inf here
        logits = self.head(self.drop(self.emb(ids) * 4.0))
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1))


class Data(Dataset):
    """Token ids below POISON_TOKEN, except sample POISON_INDEX which carries it (in `poison`/`resume`)."""

    def __init__(self, name: str) -> None:
        self.ids = torch.randint(0, POISON_TOKEN, (SIZE, SEQ), generator=torch.Generator().manual_seed(7))
        self.ids[POISON_INDEX, 3] = POISON_TOKEN  # harmless unless the row is poisoned
        if name == "all_bad":
            self.ids[ALL_BAD, 5] = POISON_TOKEN
        self.name = name

    def __len__(self) -> int:
        return SIZE

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        labels = self.ids[i].clone()
        if self.name == "masked" and i in MASKED:
            labels[:] = -100
        return {"ids": self.ids[i], "labels": labels, "index": torch.tensor(i)}


def run(out_dir: str, name: str) -> None:
    import lossguard

    def make_net() -> Net:
        net = Net()
        if name in ("poison", "resume", "all_bad"):
            with torch.no_grad():
                net.emb.weight[POISON_TOKEN] = 1e38
        return net

    rank, work, model, optimizer = start(out_dir, name, make_net)
    counted = tiny.count_collectives()  # every rank must make the same collectives: counted from here
    net = model.module
    events = os.path.join(out_dir, "poison" if name == "resume" else name, "events")
    guard = lossguard.Guard(model, optimizer, events_dir=events, recover=True, fingerprint_every=4)
    data = Data(name)
    sampler = DistributedSampler(data, shuffle=False)
    loader = DataLoader(data, batch_size=4, sampler=sampler)
    out: dict = {"losses": [], "commits": [], "seen": [], "forward_calls": 0}

    def forward(batch: dict) -> torch.Tensor:
        out["forward_calls"] += 1
        return model(**batch)

    step = 0
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        for batch in guard.batches(loader):
            step += 1
            out["seen"].append(batch["index"].tolist())
            loss = model(**batch)
            if name in ("transient", "replay_oom") and step == TRANSIENT_STEP and rank == 1:
                loss = loss * float("nan")  # the first attempt only: `forward` (the replay) is clean
                net.fail_next = name == "replay_oom"  # or raises, on this rank alone
            loss.backward()
            out["losses"].append(loss.item())
            ok = guard.commit(loss=loss, batch=batch, forward=forward)
            out["commits"].append(ok)
            if ok:
                optimizer.step()
            optimizer.zero_grad()
    guard.close()
    out["steps_by_path"] = guard.monitor.steps_by_path
    out["collectives"] = tiny.collectives_since(counted)
    torch.save({k: v.clone() for k, v in net.state_dict().items()}, os.path.join(work, f"final-rank{rank}.pt"))
    with open(os.path.join(work, f"rank{rank}.json"), "w") as fh:
        json.dump(out, fh)
    if rank == 0:  # what run_job reads back: rank 0's findings
        with open(os.path.join(work, "summary.json"), "w") as fh:
            json.dump({"findings": [f.to_dict() for f in guard.monitor._emitted]}, fh, default=str)


if __name__ == "__main__":
    tiny.run_scenarios(run)
