"""`recover` options validated once, and the `recoveries` part of the JSON report."""

from __future__ import annotations

import json

import pytest

from lossguard.api import analyze
from lossguard.monitor.options import (
    GuardOptions,
    OptionError,
    RecoverOptions,
    refuse_recover,
    refuse_snapshots,
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


def test_entry_points_without_a_gate_refuse_recover():
    refuse_recover(GuardOptions(), "LossguardLightningCallback")
    with pytest.raises(OptionError, match="not supported by LossguardLightningCallback"):
        refuse_recover(GuardOptions(recover=True), "LossguardLightningCallback")


def test_entry_points_without_snapshots_refuse_them_but_take_the_gate():
    refuse_snapshots(GuardOptions(recover=True), "lossguard.attach")
    with pytest.raises(OptionError, match="snapshot_every=5 is not supported by lossguard.attach"):
        refuse_snapshots(GuardOptions(recover=RecoverOptions(snapshot_every=5)), "lossguard.attach")


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
