"""Snapshots decided by the machine (monitor/sizing.py) and a rollback that restores everything it holds
(monitor/restorable.py): the measured size, the rollback's measured peak, the one start line, the LR
scheduler found without `scheduler=`, the GradScaler's scale. Single process (the decision is a pure function
of the gathered list; the two-rank runs are in tests/integration/test_live_rollback.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

import lossguard  # noqa: E402
from lossguard.monitor import restorable, sizing  # noqa: E402
from lossguard.monitor.snapshots import Ring, Trainable  # noqa: E402

GIB = 1 << 30


def _row(size, free, host="a", local=0, peak=0):
    return {"host": host, "local": local, "free": free, "bytes": size, "peak": peak}


def test_on_when_the_ring_and_a_rollbacks_peak_fit_in_half_the_free_memory_per_local_rank():
    rows = [_row(GIB, 10 * GIB, peak=GIB // 2), _row(GIB, 10 * GIB, peak=GIB // 2)]  # one host: 5 GiB each
    plan = sizing.plan(None, 2, rows)
    assert plan.every == sizing.AUTO_EVERY and plan.event["fits"]
    assert plan.line == ("lossguard: snapshots every 10 steps, 2 x 1.0 GiB per rank, +512.0 MiB at a rollback "
                         "(5.0 GiB free per rank)")
    assert plan.event["free_bytes_per_rank"] == 5 * GIB


def test_off_when_it_would_not_fit_saying_how_to_turn_it_on():
    rows = [_row(84 * GIB, 160 * GIB, local=8, peak=42 * GIB)] * 2
    plan = sizing.plan(None, 2, rows)
    assert plan.every == 0 and not plan.event["fits"]
    assert plan.line == ("lossguard: snapshots off: 84.0 GiB per snapshot (2 x 84.0 GiB per rank, +42.0 GiB at a "
                         "rollback would not fit in 50% of 20.0 GiB free per rank); enable with "
                         "RecoverOptions(snapshot_every=N), keep=1 to halve it")


def test_one_rank_short_of_memory_turns_them_off_on_every_rank():
    """The decision reads every rank's row: the same list, the same decision everywhere."""
    rows = [_row(GIB, 100 * GIB, host="a"), _row(GIB, 3 * GIB, host="b")]
    assert sizing.plan(None, 2, rows).every == 0
    assert sizing.plan(None, 1, rows).every == 10  # one snapshot fits in half of b's 3 GiB


def test_an_explicit_interval_is_kept_and_warned_about_when_it_would_not_fit():
    rows = [_row(84 * GIB, 100 * GIB)]
    plan = sizing.plan(3, 2, rows)
    assert plan.every == 3
    assert plan.line.endswith("; warning: more than 50% of the free memory")
    assert sizing.plan(0, 2, rows).line == "lossguard: snapshots off (snapshot_every=0)"


def test_unknown_memory_or_a_failed_measurement_is_off():
    assert sizing.plan(None, 2, [_row(1, None)]).every == 0
    plan = sizing.plan(None, 2, [_row(1, GIB), {"error": "MemoryError: x"}])
    assert plan.every == 0 and "rank 1: MemoryError: x" in plan.line


def test_the_measured_size_before_the_first_step_is_the_snapshots_real_size_after_it():
    """Adam makes its moments at its first step; the size measured before it counts them."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 4))
    model[0].requires_grad_(False)  # a frozen base: the snapshot holds what trains
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    predicted = sizing.snapshot_bytes(Trainable(model), optimizer)
    model(torch.randn(2, 256)).sum().backward()
    optimizer.step()
    snap = Ring(1, 1).take(2, 1, Trainable(model), optimizer, None)
    trained = 256 * 4 + 4
    assert snap.size == 3 * 4 * trained + 2 * 4  # weights + two moments, fp32, and Adam's two step counts
    assert predicted == 3 * 4 * trained


def test_a_rollbacks_peak_host_memory_is_what_restore_bytes_says():
    """Measured in a fresh process (its peak RSS): restoring a snapshot of a 4M-parameter Adam run allocates at
    most the fresh copy of the optimizer state (32 MiB) that `restore_bytes` predicts, nothing of the weights'
    size on top."""
    code = textwrap.dedent("""
        import json, resource, torch
        from lossguard.monitor import sizing
        from lossguard.monitor.snapshots import Ring
        model = torch.nn.Linear(2048, 2048, bias=False)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        model(torch.randn(1, 2048)).sum().backward()
        optimizer.step()
        ring = Ring(1, 1)
        snap = ring.take(2, 1, model, optimizer, None)
        expected = sizing.restore_bytes(optimizer)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        Ring.restore(snap, model, optimizer, None)
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print(json.dumps({"expected": expected, "peak": after - before}))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    numbers = json.loads(out.stdout.strip().splitlines()[-1])
    assert numbers["expected"] == 2 * 4 * 2048 * 2048 + 4  # two fp32 moments and the step count
    # An upper bound only: the allocator may hand the restore memory freed earlier in the process, so the peak
    # can grow by less than what the restore allocates (0 on a loaded machine), never by more.
    assert numbers["peak"] <= 1.25 * numbers["expected"], numbers


def _run(guard, model, optimizer, scheduler, steps, nan_after=None):
    """A seeded loop under `guard.commit`; NaN written into the weights after step `nan_after` (applied)."""
    torch.manual_seed(1)
    commits = []
    for step in range(1, steps + 1):
        loss = model(torch.randn(8, 16)).pow(2).mean()
        loss.backward()
        ok = guard.commit(loss=loss)
        commits.append(ok)
        if ok:
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
        optimizer.zero_grad()
        if step == nan_after:
            with torch.no_grad():
                model[1].weight[0, 0] = float("nan")
    guard.close()
    return commits


def _net():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 4))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _lines(events_dir, kind):
    return [json.loads(line) for line in (events_dir / "events-rank0.jsonl").read_text().splitlines()
            if json.loads(line)["type"] == kind]


def test_a_full_fine_tune_whose_ring_fits_rolls_back_by_default_restoring_the_scheduler_found(tmp_path, capsys):
    """No `snapshot_every`, no `scheduler=`: snapshots are on (a few KiB), the StepLR bound to the optimizer is
    found, and after the rollback the LR is the one of the steps applied, not of the steps counted."""
    model, optimizer = _net()
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.1)
    guard = lossguard.Guard(model, optimizer, recover=True, events_dir=tmp_path)
    commits = _run(guard, model, optimizer, scheduler, 25, nan_after=14)
    assert commits == [step != 15 for step in range(1, 26)]  # NaN written after step 14, seen in step 15's loss
    (rollback,) = _lines(tmp_path, "recovery")
    assert (rollback["kind"], rollback["snapshot"]["step"], rollback["steps_lost"]) == ("rollback", 11, 5)
    assert rollback["restored"] == ["weights", "optimizer state and its LRs", "LR scheduler StepLR", "RNG"]
    applied = 25 - 5
    assert scheduler.last_epoch == applied and optimizer.param_groups[0]["lr"] == pytest.approx(1e-2 * 0.1 ** (applied // 3))
    (line,) = _lines(tmp_path, "snapshots")
    assert line["every"] == 10 and line["fits"] and line["asked"] is None
    said = [s for s in capsys.readouterr().err.splitlines() if "lossguard: snapshots" in s]
    assert said == [line["text"]] and said[0].endswith("the LR scheduler StepLR (found), RNG")


def test_no_scheduler_bound_to_the_optimizer_is_said_and_no_scheduler_is_claimed_restored(tmp_path, capsys):
    model, optimizer = _net()
    guard = lossguard.Guard(model, optimizer, recover=True, events_dir=tmp_path)
    _run(guard, model, optimizer, None, 16, nan_after=14)
    (rollback,) = _lines(tmp_path, "recovery")
    assert rollback["restored"] == ["weights", "optimizer state and its LRs", "RNG"]
    assert "scheduler" not in rollback["action"]
    assert "no LR scheduler (none given, none bound to the optimizer)" in _lines(tmp_path, "snapshots")[0]["text"]


def test_a_ring_that_would_not_fit_is_off_and_weights_gone_bad_halt(tmp_path, monkeypatch):
    monkeypatch.setattr(sizing, "free_bytes", lambda: 1000)
    model, optimizer = _net()
    guard = lossguard.Guard(model, optimizer, recover=True, events_dir=tmp_path)
    with pytest.raises(lossguard.LossguardHalt):
        _run(guard, model, optimizer, None, 25, nan_after=5)
    (line,) = _lines(tmp_path, "snapshots")
    assert line["every"] == 0 and line["text"].startswith("lossguard: snapshots off: ")
    assert guard.ring is None


def test_schedulers_chained_by_sequential_lr_are_all_found_and_restored():
    model, optimizer = _net()
    warm = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.1, total_iters=3)
    decay = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    chain = torch.optim.lr_scheduler.SequentialLR(optimizer, [warm, decay], milestones=[3])
    found = restorable.find(optimizer)
    assert {id(s) for s in found} == {id(warm), id(decay), id(chain)}
    held = restorable.bundle(found)
    saved = held.state_dict()
    epochs = [s.last_epoch for s in found]
    for _ in range(5):
        optimizer.step()
        chain.step()
    assert [s.last_epoch for s in found] != epochs
    held.load_state_dict(saved)
    assert [s.last_epoch for s in found] == epochs and held.state_dict() == saved


def test_the_grad_scalers_scale_comes_back_with_the_snapshot():
    model, optimizer = _net()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    scaler.scale(torch.ones(()))  # the scaler makes its scale at its first scale()
    held = restorable.scaler_state(scaler)
    ring = Ring(1, 1)
    snap = ring.take(1, 0, Trainable(model), optimizer, None, held)
    scaler.update(2.0 ** 3)
    scaler._growth_tracker.fill_(7)
    Ring.restore(snap, Trainable(model), optimizer, None, held)
    assert scaler.get_scale() == 2.0 ** 10 and int(scaler._growth_tracker) == 0
