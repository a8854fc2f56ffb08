"""`recover` options validated once, and the `recoveries` part of the JSON report."""

from __future__ import annotations

import json

import pytest

from lossguard.api import analyze
from lossguard.monitor.options import (
    GuardOptions,
    OptionError,
    RecoverOptions,
)


def test_recover_defaults_and_refinement():
    assert GuardOptions().recovery is None
    assert GuardOptions(recover=True).recovery == RecoverOptions(budget=3, window=100)
    assert GuardOptions(recover=RecoverOptions(budget=1, window=5)).recovery == RecoverOptions(budget=1, window=5)


@pytest.mark.parametrize(("kwargs", "said"), [
    ({"recover": "yes"}, "recover must be True, False or a lossguard.RecoverOptions"),
    ({"recover": {"budget": 3}}, "got {'budget': 3}"),
])
def test_bad_recover_names_the_key_and_value(kwargs, said):
    with pytest.raises(OptionError, match="recover") as info:
        GuardOptions(**kwargs)
    assert said in str(info.value)


@pytest.mark.parametrize(("kwargs", "said"), [
    ({"budget": 0}, "recover.budget must be an int >= 1, got 0"),
    ({"window": True}, "recover.window must be an int >= 1, got True"),
    ({"budget": 5, "window": 4}, "recover.budget (5) must not exceed recover.window (4)"),
])
def test_bad_recover_options(kwargs, said):
    with pytest.raises(OptionError) as info:
        RecoverOptions(**kwargs)
    assert said in str(info.value)


def _events(path, lines):
    header = {"type": "header", "format": "lossguard-events", "version": 1, "rank": 0, "world_size": 1}
    records = [{"type": "record", "kind": "train", "step": s, "rank": 0, "signals": {"loss": 2.0 - s / 100,
                "raw_loss": 2.0 - s / 100, "grad_norm": 1.0}} for s in range(1, 30)]
    path.mkdir()
    (path / "events-rank0.jsonl").write_text("".join(json.dumps(x, separators=(",", ":")) + "\n" for x in [header, *records, *lines]))
    return path


def test_recoveries_always_present_and_empty_when_none(tmp_path):
    report = analyze([_events(tmp_path / "ev", [])]).to_dict()
    assert report["recoveries"] == [] and report["verdict"] == "healthy"


def test_recovery_lines_become_recoveries_once_per_step(tmp_path):
    line = {"type": "recovery", "step": 7, "ranks": [1], "kind": "held", "samples": [], "steps_lost": 1,
            "signature": "nonfinite", "code": "LOSS001", "action": "held", "faults": [], "budget": {}}
    diagnosis = analyze([_events(tmp_path / "ev", [line, line, {**line, "ranks": "bad", "step": 9}])])
    report = diagnosis.to_dict()
    assert report["recoveries"] == [
        {"step": 7, "ranks": [1], "kind": "held", "samples": [], "steps_lost": 1, "signature": "nonfinite",
         "code": "LOSS001", "action": "held"},
        {"step": 9, "ranks": [], "kind": "held", "samples": [], "steps_lost": 1, "signature": "nonfinite",
         "code": "LOSS001", "action": "held"}]
    assert report["verdict"] == "warning"  # a recovered run never reads as healthy
    assert [f["code"] for f in report["findings"]] == ["REC001"]
    assert report["stats"]["events"] == {}  # the recovery lines reached no detector


def test_a_logs_values_at_a_recovered_step_are_left_out(tmp_path):
    """The Trainer's NaN filter logs a made-up loss at a step the guard held (its first attempt): beside the
    guard's events that value must not reach the detectors, where it reads as a drop then a divergence."""
    run = tmp_path / "run"
    held = {"type": "recovery", "step": 8, "ranks": [0], "kind": "held", "samples": [], "steps_lost": 1,
            "signature": "nonfinite", "code": "LOSS001", "action": "held: ..."}
    header = {"type": "header", "format": "lossguard-events", "version": 1, "world_size": 2}
    run.mkdir()
    for rank in (0, 1):
        records = [{"type": "record", "kind": "train", "step": s, "rank": rank,
                    "signals": {"loss": 4.0 - s / 100, "raw_loss": 4.0 - s / 100, "grad_norm": 1.0}}
                   for s in range(1, 21) if s != 8]
        lines = [{**header, "rank": rank}, *records, held]
        (run / f"events-rank{rank}.jsonl").write_text("".join(json.dumps(x, separators=(",", ":")) + "\n"
                                                              for x in lines))
    history = [{"step": s, "loss": 1.8 if s == 8 else 4.0 - s / 100, "grad_norm": 1.0, "learning_rate": 1e-3}
               for s in range(1, 21)]
    (run / "trainer_state.json").write_text(json.dumps({"global_step": 20, "log_history": history}))
    report = analyze([run]).to_dict()
    assert [r["step"] for r in report["recoveries"]] == [8]
    assert report["verdict"] == "warning" and [f["code"] for f in report["findings"]
                                               if f["severity"] != "info"] == ["REC001"]
    without = tmp_path / "alone"
    without.mkdir()
    (without / "trainer_state.json").write_text((run / "trainer_state.json").read_text())
    assert analyze([without]).to_dict()["verdict"] == "broken"  # the same log alone: the made-up drop diverges


def test_snapshot_every_defaults_to_none_decided_by_the_host_and_is_validated():
    assert RecoverOptions().snapshot_every is None  # decided at the first step (tests/unit/test_snapshot_sizing.py)
    with pytest.raises(OptionError, match="snapshot_every must be None"):
        RecoverOptions(snapshot_every=-1)


def test_guards_snapshot_holds_the_trained_weights_and_buffers_not_the_frozen_ones():
    import torch

    from lossguard.monitor.snapshots import Ring, Trainable

    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.BatchNorm1d(64), torch.nn.Linear(64, 4))
    model[0].requires_grad_(False)
    snap = Ring(1, 1).take(1, 0, Trainable(model), None, None)
    assert sorted(snap.model) == ["1.bias", "1.num_batches_tracked", "1.running_mean", "1.running_var",
                                  "1.weight", "2.bias", "2.weight"]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    Ring.restore(snap, Trainable(model), None, None)
    after = model.state_dict()
    assert all(torch.equal(after[k], before[k]) for k in before if not k.startswith("0."))
    assert torch.equal(after["0.weight"], before["0.weight"] + 1.0)  # frozen: not in the snapshot, left alone
