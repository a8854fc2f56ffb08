"""Probe arms: auto arms from lint + the known issues' prevention defaults, the arms file, the comparison logic (pure)."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from lossguard.probe.arms import BASELINE, ArmsError, apply_changes, auto_arms, load_arms_file
from lossguard.probe.compare import compare, disagreement, judge


def names(arms):
    return [a.name for a in arms]


def test_auto_arms_bf16_zero2_overlap():
    config = {"zero_optimization": {"stage": 2, "overlap_comm": True}, "bf16": {"enabled": True},
              "communication_data_type": "fp32"}
    arms = auto_arms(config, env={"deepspeed": "0.19.8", "torch": "2.13.0"})
    assert arms[0].name == BASELINE and arms[0].changes == {}
    changes = [a.changes for a in arms[1:]]
    assert {"bf16.check_grad_overflow": True} in changes
    assert {"zero_optimization.overlap_comm": False} in changes
    assert {"communication_data_type": None} in changes
    assert {"zero_optimization.stage": 3} in changes
    assert len({json.dumps(a.config(config), sort_keys=True) for a in arms}) == len(arms)  # no duplicates


def test_auto_arms_fp16_and_zero3():
    arms = auto_arms({"zero_optimization": {"stage": 3}, "fp16": {"enabled": "auto"}}, env={})
    assert [a.changes for a in arms[1:]] == [{"fp16.enabled": False, "bf16.enabled": True}]


def test_apply_changes_sets_and_deletes():
    config = {"a": {"b": 1}, "c": 2}
    assert apply_changes(config, {"a.b": 3, "c": None, "d.e": True}) == {"a": {"b": 3}, "d": {"e": True}}
    assert config == {"a": {"b": 1}, "c": 2}


def test_arms_file(tmp_path):
    path = tmp_path / "arms.yaml"
    path.write_text("- {name: z3, changes: {zero_optimization.stage: 3}}\n- changes: {bf16.enabled: true}\n")
    arms = load_arms_file(path)
    assert names(arms) == [BASELINE, "z3", "bf16.enabled: true"]
    path.write_text("- {name: z3, changes: [1]}\n- 5\n")
    with pytest.raises(ArmsError, match="arm 1.*arm 2"):
        load_arms_file(path)


def _outcome(name, changes, losses, rc=0, signature=None, onset=None, verdict="healthy", expected_steps=None):
    from lossguard.probe.arms import Arm

    series = {"loss": {"rank0": list(enumerate(losses, 1))}}
    diagnosis = SimpleNamespace(signature=signature, onset_step=onset, verdict=verdict,
                                result=SimpleNamespace(series=SimpleNamespace(to_dict=lambda: series)))
    run = SimpleNamespace(returncode=rc, timed_out=False, last_step=len(losses))
    return judge(Arm(name, changes), run, diagnosis, expected_steps)


def test_a_crash_after_the_last_asked_step_is_a_shutdown_crash_not_a_death():
    nan = math.nan
    teardown = _outcome("z1", {}, [4.0, 3.9, 3.8], rc=1, expected_steps=3)
    assert teardown.verdict == "survives" and "exited 1 after its last step (3)" in teardown.note
    assert teardown.returncode == 1
    # Not when probe does not know how many steps were asked, nor before the last one, nor for a dead loss.
    assert _outcome("z1", {}, [4.0, 3.9, 3.8], rc=1).signature == "crash"
    assert _outcome("z1", {}, [4.0, 3.9], rc=1, expected_steps=3).verdict == "dies"
    assert _outcome("z1", {}, [4.0, nan, nan], rc=1, expected_steps=3).verdict == "dies"


def test_judge_and_verdict_line():
    nan, inf = math.nan, math.inf
    base = _outcome("baseline", {}, [4.0, 3.9, inf, nan, nan], signature="nonfinite", onset=3, verdict="broken")
    fix = _outcome("check", {"bf16.check_grad_overflow": True}, [4.0, 3.9, inf, 3.8, 3.7],
                   signature="nonfinite", onset=3, verdict="broken")
    crash = _outcome("z3", {"zero_optimization.stage": 3}, [4.0], rc=1)
    assert (base.verdict, base.onset_step) == ("dies", 3)
    assert fix.verdict == "survives" and "recovered" in fix.note
    assert crash.verdict == "dies" and crash.signature == "crash"
    result = compare([base, crash, fix])
    assert result.verdict_line == "baseline dies at step 3 with nonfinite; arm `check` survives → fix"
    assert result.recommended is fix and result.exit_code == 0
    assert fix.first_disagreement == 4
    assert compare([base, crash]).exit_code == 1


def test_disagreement_tolerance():
    assert disagreement({1: 1.0, 2: 2.0}, {1: 1.0, 2: 2.0005}) == (None, pytest.approx(5e-4))
    assert disagreement({1: 1.0, 2: 2.0}, {1: 1.0, 2: 2.1})[0] == 2
