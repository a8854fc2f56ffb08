"""Gradient accumulation with `commit(forward=...)` (one process): `forward` recomputes one batch, so a
held step's replay would commit the last micro-batch alone and call the step recovered. The guard says so
at the first step and holds such a step whole: the run is exactly the one the record describes (that step
not applied), never silently different."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

import lossguard  # noqa: E402

GA, STEPS, FAULT_STEP = 4, 6, 3


def _batches() -> list[dict]:
    generator = torch.Generator().manual_seed(3)
    return [{"x": torch.randn(8, 4, generator=generator), "y": torch.randn(8, generator=generator)}
            for _ in range(GA * STEPS)]


def _run(tmp_path, guarded: bool) -> tuple[list[bool], dict]:
    """The NaN is the loop's, on the last micro-batch's first attempt at FAULT_STEP (a replay would be clean).
    Unguarded: the same loop that simply does not apply FAULT_STEP."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-1)
    guard = lossguard.Guard(model, optimizer, events_dir=tmp_path, recover=True) if guarded else None

    def forward(b):
        return ((model(b["x"]).squeeze(-1) - b["y"]) ** 2).mean() / GA

    data = iter(guard.batches(_batches()) if guarded else _batches())
    commits = []
    for step in range(1, STEPS + 1):
        for micro in range(GA):
            batch = next(data)
            loss = forward(batch)
            if step == FAULT_STEP and micro == GA - 1:
                loss = loss * float("nan")
            loss.backward()
        ok = guard.commit(loss=loss, batch=batch, forward=forward) if guarded else step != FAULT_STEP
        commits.append(ok)
        if ok:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    if guard is not None:
        guard.close()
    return commits, {k: v.clone() for k, v in model.state_dict().items()}


def test_a_held_step_under_accumulation_is_held_whole_never_half_replayed(tmp_path, capsys):
    commits, weights = _run(tmp_path, guarded=True)
    said = capsys.readouterr().err
    _, expected = _run(tmp_path / "ref", guarded=False)
    assert commits == [step != FAULT_STEP for step in range(1, STEPS + 1)]
    assert all(torch.equal(weights[k], expected[k]) for k in weights)  # what the record says happened
    lines = [json.loads(line) for line in (tmp_path / "events-rank0.jsonl").read_text().splitlines()]
    recoveries = [line for line in lines if line["type"] == "recovery"]
    assert [(r["step"], r["kind"], r["steps_lost"]) for r in recoveries] == [(FAULT_STEP, "held", 1)]
    assert recoveries[0]["action"].startswith("held: gradient accumulation, not replayed")
    assert said.count("gradient accumulation (4 micro-batches per optimizer step)") == 1


def test_one_micro_batch_per_step_still_replays(tmp_path):
    """The same guard without accumulation: the transient NaN is replayed and committed, as before."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-1)
    guard = lossguard.Guard(model, optimizer, events_dir=tmp_path, recover=True, console=False)

    def forward(b):
        return ((model(b["x"]).squeeze(-1) - b["y"]) ** 2).mean()

    commits = []
    for step, batch in enumerate(guard.batches(_batches()[:STEPS]), 1):
        loss = forward(batch) * (float("nan") if step == FAULT_STEP else 1.0)
        loss.backward()
        commits.append(guard.commit(loss=loss, batch=batch, forward=forward))
        if commits[-1]:
            optimizer.step()
        optimizer.zero_grad()
    guard.close()
    assert all(commits)
    lines = [json.loads(line) for line in (tmp_path / "events-rank0.jsonl").read_text().splitlines()]
    assert [line["kind"] for line in lines if line["type"] == "recovery"] == ["transient"]
