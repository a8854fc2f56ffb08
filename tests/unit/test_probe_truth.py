"""Probe proves only what it measured (issue #24 item 1): fingerprints compared like with like, fates never
called agreement, repeats that disagree said, a fix only on the setting the death blames, the crash's own
error line. Pure: no torch, no job."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from lossguard.probe import blame
from lossguard.probe.arms import Arm
from lossguard.probe.compare import compare, judge, settle
from lossguard.probe.evidence import crash_line, diagnose_arm
from lossguard.probe.report import against_baseline

FIXTURES = Path(__file__).parents[1] / "fixtures"
HEALTHY_ARM = FIXTURES / "probe" / "healthy-bf16-zero2"
NAN = math.nan


def outcome(name, changes, losses, *, signature=None, onset=None, verdict="healthy", rc=0, crash=None):
    series = {"loss": {"rank0": list(enumerate(losses, 1))}}
    diagnosis = SimpleNamespace(signature=signature, onset_step=onset, verdict=verdict,
                                result=SimpleNamespace(series=SimpleNamespace(to_dict=lambda: series)))
    run = SimpleNamespace(returncode=rc, timed_out=False, last_step=len(losses) or None, dir=Path(name))
    return judge(Arm(name, changes), run, diagnosis, None, crash)


def desync_death(name="baseline", changes=None):
    return outcome(name, changes or {}, [4.0, 3.9, 3.8], signature="rank-desync", onset=1, verdict="broken")


def healthy(name, changes, losses=(4.0, 3.9, 3.8)):
    return outcome(name, changes, list(losses))


# -- fingerprints: the same quantity on every rank ------------------------------------------------------------
def test_the_jobs_param_sum_is_not_compared_with_the_guards_fingerprint():
    """The real baseline of the issue's healthy bf16 ZeRO-2 config: stdout prints `param_sum` (a plain sum,
    160.6), the guard's events carry its norm-weighted fingerprint (54.4). Rank 1's line came first in the
    issue's run (the ranks' print order is a race); read together, the desync check compared 160.6 with 54.4."""
    from lossguard.api import analyze

    mixed = analyze([HEALTHY_ARM / "stdout.log", HEALTHY_ARM / "events"])
    assert mixed.signature is None  # RANK001 compares each kind of fingerprint only with itself
    diagnosis = diagnose_arm(HEALTHY_ARM / "stdout.log", HEALTHY_ARM / "events")
    assert diagnosis.verdict == "healthy" and diagnosis.signature is None
    assert not [f for f in diagnosis.findings if f.code == "RANK001"]


def test_without_the_guards_events_the_jobs_own_fingerprint_still_counts(tmp_path):
    log = tmp_path / "stdout.log"
    log.write_text("".join(f"[rank{r}] step {s} loss {4 - s / 10} grad_norm 1.0 param_sum {160 + s + 5 * r * (s > 2)}\n"
                           for s in range(1, 6) for r in (0, 1)))
    diagnosis = diagnose_arm(log, tmp_path / "events")
    assert diagnosis.signature == "rank-desync" and diagnosis.onset_step == 3


# -- fate before agreement ------------------------------------------------------------------------------------
def test_an_arm_whose_fate_differs_never_agrees_with_the_baseline():
    base = desync_death()
    same_losses = healthy("overlap off", {"zero_optimization.overlap_comm": False})
    compare([base, same_losses])
    assert same_losses.first_disagreement is None and same_losses.max_abs_dloss == 0  # identical numbers ...
    assert same_losses.agrees is False  # ... and still not agreement: one died, the other did not
    text = against_baseline(same_losses, base)
    assert "agrees" not in text and text.startswith("fate differs from baseline (baseline dies, this arm survives)")
    assert same_losses.to_dict()["agrees_with_baseline"] is False


def test_same_fate_and_numbers_agree():
    base, other = healthy("baseline", {}), healthy("zero3", {"zero_optimization.stage": 3})
    result = compare([base, other])
    assert other.agrees is True and against_baseline(other, base) == "agrees with baseline"
    assert result.exit_code == 0 and result.recommended is None
    assert result.verdict_line.startswith("baseline survives 3 steps; no arm dies, and all 2 agree")


# -- repeats --------------------------------------------------------------------------------------------------
def test_repeats_that_disagree_are_said_not_picked():
    arm = settle(desync_death("z", {"zero_optimization.stage": 3}), [healthy("z", {"zero_optimization.stage": 3})])
    assert arm.verdict == "unstable" and arm.num_deaths == 1 and len(arm.runs) == 2
    assert arm.note.startswith("dies in 1 of 2 runs (run 1: rank-desync at step 1)")
    assert [r["verdict"] for r in arm.to_dict()["runs"]] == ["dies", "survives"]


def test_an_unstable_baseline_proves_no_fix():
    base = settle(desync_death(), [healthy("baseline", {})])
    fix = settle(healthy("overlap off", {"zero_optimization.overlap_comm": False}),
                 [healthy("overlap off", {"zero_optimization.overlap_comm": False})])
    result = compare([base, fix])
    assert result.recommended is None and result.exit_code == 1
    assert "baseline dies in 1 of 2 runs" in result.verdict_line and "does not repeat" in result.verdict_line


def test_a_candidate_that_dies_on_a_repeat_is_not_the_fix():
    base = settle(desync_death(), [desync_death()])
    flaky = settle(healthy("overlap off", {"zero_optimization.overlap_comm": False}),
                   [desync_death("overlap off", {"zero_optimization.overlap_comm": False})])
    steady = settle(healthy("zero3", {"zero_optimization.stage": 3}), [healthy("zero3", {"zero_optimization.stage": 3})])
    result = compare([base, flaky, steady])
    assert flaky.verdict == "unstable"
    assert result.recommended is steady
    assert result.verdict_line == ("baseline dies at step 1 with rank-desync in all 2 runs; arm `zero3` survives "
                                   "in all 2 runs → fix")
    assert compare([base, flaky]).recommended is None
    assert "arm `overlap off` dies in 1 of 2 runs" in compare([base, flaky]).verdict_line


# -- the blamed setting ---------------------------------------------------------------------------------------
def test_an_arm_off_the_blamed_setting_is_never_recommended():
    """The issue's run: `steps_per_print: 10` survived a (false) rank-desync death and was written out as the
    fix. Printing less often cannot bring replicas back in sync."""
    base = desync_death()
    printing = healthy("steps_per_print: 10", {"steps_per_print": 10})
    result = compare([base, printing])
    assert result.recommended is None and result.exit_code == 1
    assert "arm `steps_per_print: 10` survives but changes nothing the death blames" in result.verdict_line
    overlap = healthy("overlap off", {"zero_optimization.overlap_comm": False})
    assert compare([base, printing, overlap]).recommended is overlap


@pytest.mark.parametrize(("signature", "key", "blamed"), [
    ("nonfinite", "bf16.check_grad_overflow", True),
    ("nonfinite", "steps_per_print", False),
    ("rank-desync", "zero_optimization.overlap_comm", True),
    ("rank-desync", "wall_clock_breakdown", False),
    ("lr-zero", "scheduler.params.warmup_max_lr", True),
    ("lr-zero", "bf16.enabled", False),
    ("masked-labels", "zero_optimization.stage", False),
    ("timeout", "zero_optimization.overlap_comm", True),
])
def test_blamed_sections(signature, key, blamed):
    assert blame.changes_blamed([key], signature) is blamed


def test_a_crash_blames_the_key_its_error_line_names():
    line = ("pydantic_core._pydantic_core.ValidationError: 1 validation error for DeepSpeedZeroConfig | "
            "reduce_bucket_size | Input should be a valid integer [type=int_type, input_value=None]")
    assert blame.changes_blamed(["zero_optimization.reduce_bucket_size"], "crash", line)
    assert not blame.changes_blamed(["zero_optimization.stage"], "crash", line)
    assert not blame.changes_blamed(["zero_optimization.reduce_bucket"], "crash", line)


# -- every arm crashed ----------------------------------------------------------------------------------------
def test_every_arm_crashed_before_a_step_is_exit_2_with_the_error_line():
    line = "ValueError: reduce_bucket_size must be an int"
    arms = [outcome(n, c, [], rc=1, crash=line) for n, c in (("baseline", {}), ("z3", {"zero_optimization.stage": 3}))]
    assert arms[0].note == f"job ended with crash (exit 1): {line}" and arms[0].to_dict()["crash"] == line
    result = compare(arms)
    assert result.exit_code == 2 and result.recommended is None
    assert result.verdict_line.startswith(f"every arm crashed before its first step: {line};")


def test_arms_that_trained_and_died_stay_exit_1():
    arms = [outcome("baseline", {}, [4.0, NAN, NAN], signature="nonfinite", onset=2, verdict="broken"),
            outcome("z3", {"zero_optimization.stage": 3}, [4.0], rc=1, crash="RuntimeError: boom")]
    result = compare(arms)
    assert result.exit_code == 1 and result.verdict_line.endswith("every arm dies: no fix proven")


def test_crash_line_is_the_jobs_own_last_error(tmp_path):
    """torchrun's own report (torch.distributed.elastic...ChildFailedError) comes last; the rank's error is
    the one to show, with pydantic's field and reason from the lines after it."""
    log = tmp_path / "stdout.log"
    log.write_text(
        "[rank0]: Traceback (most recent call last):\n"
        '[rank0]:   File "x.py", line 3, in <module>\n'
        "[rank0]: pydantic_core._pydantic_core.ValidationError: 1 validation error for DeepSpeedZeroConfig\n"
        "[rank0]: reduce_bucket_size\n"
        "[rank0]:   Input should be a valid integer [type=int_type, input_value=None, input_type=NoneType]\n"
        "[rank0]:     For further information visit https://errors.pydantic.dev/2.14/v/int_type\n"
        "Traceback (most recent call last):\n"
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n")
    assert crash_line([log]) == (
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for DeepSpeedZeroConfig | "
        "reduce_bucket_size | Input should be a valid integer [type=int_type, input_value=None, input_type=NoneType]")
    log.write_text("step 1 loss 3.2\nall fine\n")
    assert crash_line([log]) is None
