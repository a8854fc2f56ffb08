"""A held loss jump, replayed (`commit(forward=...)`, one process): a jump that does not come back is
transient and its replay committed; one that comes back with the same batch and weights, its update still
abnormal, keeps the step held; one whose replayed loss is high but whose replayed update is ordinary is the
batch's data: committed; two batches in a row that jump again roll the weights back."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

import lossguard  # noqa: E402
from lossguard.monitor.jump import WARMUP  # noqa: E402

JUMP_STEP = WARMUP + 5


def _train(tmp_path, scale_first_attempt: float, scale_batch: float,
           offset_batch: float = 0.0, jump_steps: tuple[int, ...] = (JUMP_STEP,)) -> tuple[list[bool], list[dict]]:
    """JUMP_STEP's loss is scaled on its first attempt only (`scale_first_attempt`: the replay is clean), or
    by its batch (`scale_batch`: the replay gives it again); either scales its gradients as much (an
    abnormal update). `offset_batch` adds a constant to that batch's loss: high, its gradients ordinary."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    guard = lossguard.Guard(model, optimizer, events_dir=tmp_path, recover=True, console=False)
    commits = []
    for step, batch in enumerate(guard.batches([{"x": torch.randn(8, 4), "scale": torch.ones(8),
                                                 "offset": torch.ones(8)} for _ in range(max(jump_steps) + 3)]), 1):
        if step in jump_steps:
            batch["scale"] = torch.full((8,), scale_batch)
            batch["offset"] = torch.full((8,), 1.0 + offset_batch)

        def forward(b):
            return (model(b["x"]).squeeze(-1) ** 2 * b["scale"] + b["offset"]).mean()

        loss = forward(batch) * (scale_first_attempt if step in jump_steps else 1.0)
        loss.backward()
        ok = guard.commit(loss=loss, batch=batch, forward=forward)
        commits.append(ok)
        if ok:
            optimizer.step()
        optimizer.zero_grad()
    guard.close()
    lines = [json.loads(line) for line in (tmp_path / "events-rank0.jsonl").read_text().splitlines()]
    return commits, [line for line in lines if line["type"] == "recovery"]


def test_a_jump_that_does_not_come_back_is_transient(tmp_path):
    commits, recoveries = _train(tmp_path, scale_first_attempt=50.0, scale_batch=1.0)
    assert all(commits)  # the replay's gradients were committed
    assert [(r["step"], r["kind"], r["signature"], r["steps_lost"]) for r in recoveries] == [
        (JUMP_STEP, "transient", "loss-spike", 0)]


def test_a_jump_that_comes_back_on_replay_stays_held(tmp_path):
    commits, recoveries = _train(tmp_path, scale_first_attempt=1.0, scale_batch=500.0)
    assert commits == [step != JUMP_STEP for step in range(1, JUMP_STEP + 4)]
    assert [(r["step"], r["kind"], r["signature"], r["steps_lost"]) for r in recoveries] == [
        (JUMP_STEP, "held", "loss-spike", 1)]
    assert recoveries[0]["action"].startswith("held: replayed, the loss jumped")
    assert recoveries[0]["replay"]["faulted_again"] == [0]


def test_a_jump_whose_replayed_update_is_ordinary_is_the_datas_and_committed(tmp_path):
    """The first attempt's loss and update both jumped; the replay's loss is as high (the batch's own) but
    its update ordinary: a hard batch, not a fault; the replay is committed, no step lost."""
    commits, recoveries = _train(tmp_path, scale_first_attempt=50.0, scale_batch=1.0, offset_batch=100.0)
    assert all(commits)
    assert [(r["step"], r["kind"], r["steps_lost"]) for r in recoveries] == [(JUMP_STEP, "transient", 0)]
    assert recoveries[0]["replay"]["losses"]["0"] > recoveries[0]["faults"][0]["limit"]


def test_two_batches_in_a_row_whose_jump_comes_back_roll_the_weights_back(tmp_path):
    """One batch that jumps again on its replay is that batch's (held above); the next batch jumping too
    says the weights are at fault: with snapshots (on by default for this tiny model) the run rolls back."""
    commits, recoveries = _train(tmp_path, scale_first_attempt=1.0, scale_batch=500.0,
                                 jump_steps=(JUMP_STEP, JUMP_STEP + 1))
    assert [(r["step"], r["kind"]) for r in recoveries] == [(JUMP_STEP, "held"), (JUMP_STEP + 1, "rollback")]
    assert commits[JUMP_STEP - 1:JUMP_STEP + 1] == [False, False]
