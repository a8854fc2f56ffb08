"""Recovery that does no harm (issue 32, "hold only what would harm"), in real two-rank DDP runs over gloo
(live_jobs/noharm_job.py): healthy but unusual runs train under `Guard(recover=True)` exactly as without
lossguard (bit-equal weights on CPU) with no recovery event; a run that diverges from its second step is
held, then halted on the budget. Every alarm has its healthy twin here."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from tests.integration.live_helpers import analyze_json, rank_outputs, run_job  # noqa: E402

SCENARIOS = ["shift-plain", "shift-recover", "shift-halt", "hard-plain", "hard-recover", "fp16-plain", "fp16-guard",
             "fp16-recover", "diverge-plain", "diverge-recover", "diverge-halt"]
SHIFT_AT, HARD_EVERY = 81, 35  # noharm_job.py


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    out = tmp_path_factory.mktemp("noharm")
    run_job("noharm_job.py", out, SCENARIOS, timeout_s=300)
    return out, rank_outputs(out, SCENARIOS)


def _recoveries(out, name: str) -> list[dict]:
    return [line for r in (0, 1) for line in map(json.loads, (out / name / "events" / f"events-rank{r}.jsonl")
                                                  .read_text().splitlines()) if line["type"] in ("recovery", "halt")]


def _same_weights(out, name: str, twin: str) -> bool:
    for r in (0, 1):
        mine = torch.load(out / name / f"weights-rank{r}.pt")
        theirs = torch.load(out / twin / f"weights-rank{r}.pt")
        if not all(torch.equal(mine[key], theirs[key]) for key in theirs):
            return False
    return True


@pytest.mark.parametrize("case", ["shift", "hard", "fp16"])
def test_a_healthy_unusual_run_trains_exactly_as_without_lossguard(job, case):
    out, ranks = job
    for arm in ("recover", "guard") if case == "fp16" else ("recover",):
        name = f"{case}-{arm}"
        assert _recoveries(out, name) == [], name  # no held step, no halt
        for mine, plain in zip(ranks[name], ranks[f"{case}-plain"], strict=True):
            assert all(mine["commits"]) and mine["halted_at"] is None
            assert mine["losses"] == plain["losses"] and mine["eval"] == plain["eval"]
        assert _same_weights(out, name, f"{case}-plain"), name


def test_the_switch_to_harder_data_is_learnt(job):
    """The loss leaps at the switch (the gate's old loss-only test held these steps and halted) and the run
    learns the new task as the unguarded one does."""
    _, ranks = job
    losses = ranks["shift-recover"][0]["losses"]
    assert losses[SHIFT_AT - 1] > 10 * losses[SHIFT_AT - 2]
    assert ranks["shift-recover"][0]["eval"]["hard"] < 1.0 < ranks["shift-recover"][0]["eval"]["easy"]


def test_a_rare_hard_batch_is_trained_on(job):
    _, ranks = job
    losses = ranks["hard-recover"][0]["losses"]
    for step in (HARD_EVERY, 2 * HARD_EVERY):
        assert losses[step - 1] > 10 * losses[step - 2]  # far above the run's spread, and committed


def test_fp16_start_up_overflows_are_the_scalers_business(job):
    """The GradScaler starts too high: its first steps overflow (it skips them and halves its scale). Not
    held, no budget (more overflows than the budget of 3), no finding with halt_on="error"."""
    out, ranks = job
    scales = ranks["fp16-recover"][0]["scales"]
    overflows = sum(1 for before, after in zip(scales, scales[1:]) if after < before)
    assert overflows > 3
    for name in ("fp16-guard", "fp16-recover"):
        summary = json.loads((out / name / "summary.json").read_text())
        assert [f for f in summary["findings"] if f["severity"] != "info"] == [], name
    assert analyze_json(out / "fp16-recover" / "events")["recoveries"] == []


def test_a_run_diverging_from_its_second_step_is_held_then_halted(job):
    """Adam at LR 30: the loss leaps 1000x at step 2 with a gradient norm 60x the first step's. Before any
    history the gate judges it against the first step: held at 2, 3, 4, halted at 5 on both ranks; the
    unguarded twin trains on at losses in the hundreds and thousands."""
    out, ranks = job
    for rank in ranks["diverge-recover"]:
        assert rank["commits"] == [True, False, False, False] and rank["halted_at"] == 5
    events = _recoveries(out, "diverge-recover")
    assert [(e["type"], e["step"]) for e in events if e["type"] == "recovery"] == [
        ("recovery", step) for step in (2, 3, 4)] * 2
    fault = next(e for e in events if e["type"] == "recovery")["faults"][0]
    assert fault["loss"] > 1000 * fault["typical"] and fault["norm"] > 10 * fault["norm_typical"]
    assert [e["reason"] for e in events if e["type"] == "halt"] == ["recovery-budget"] * 2
    plain = ranks["diverge-plain"][0]
    assert plain["halted_at"] is None and max(plain["losses"][1:]) > 1000 * plain["losses"][0]


def _events(out, name: str, kind: str) -> list[dict]:
    return [line for r in (0, 1) for line in map(json.loads, (out / name / "events" / f"events-rank{r}.jsonl")
                                                  .read_text().splitlines()) if line["type"] == kind]


def test_halt_on_broken_lets_a_switch_to_harder_data_train_on(job):
    """Guard(halt_on="broken") without recovery: the leap at the switch is reported at once as a divergence
    (LOSS005), but the halt waits for the logs that could refute it; the model learns the new task, the loss
    comes back down, so no rank halts and the run trains exactly as without lossguard."""
    out, ranks = job
    for mine, plain in zip(ranks["shift-halt"], ranks["shift-plain"], strict=True):
        assert mine["halted_at"] is None and mine["losses"] == plain["losses"]
    assert _same_weights(out, "shift-halt", "shift-plain")
    waived = _events(out, "shift-halt", "halt-waived")
    assert [(e["code"], e["finding_step"]) for e in waived] == [("LOSS005", waived[0]["finding_step"])] * 2
    assert waived[0]["finding_step"] >= SHIFT_AT and "learn" in waived[0]["why"]
    summary = json.loads((out / "shift-halt" / "summary.json").read_text())
    assert [f["severity"] for f in summary["findings"] if f["code"] == "LOSS005"] == ["warning"]
    assert analyze_json(out / "shift-halt" / "events")["verdict"] != "broken"


def test_halt_on_broken_still_stops_a_real_divergence(job):
    """The twin: Adam at LR 30 diverges from step 2 and stays in the hundreds; the waiting halt finds nothing
    against it and stops every rank at the same step, within the wait (LOSS005.settle_logs) of the finding."""
    out, ranks = job
    from lossguard.detectors.trends import LossDivergence
    halts = {r["halted_at"] for r in ranks["diverge-halt"]}
    assert len(halts) == 1 and None not in halts
    halted = halts.pop()
    assert halted <= 2 + LossDivergence._JUMP_STREAK + LossDivergence.SETTLE_LOGS
    assert _events(out, "diverge-halt", "halt-waived") == []
    assert [e["codes"] for e in _events(out, "diverge-halt", "halt")] == [["LOSS005"]] * 2


SNAP_CASES = ["steplr", "lambdalr", "lora", "ga4"]


@pytest.fixture(scope="module")
def snap_job(tmp_path_factory):
    out = tmp_path_factory.mktemp("noharm-snap")
    names = [f"{case}-{arm}" for case in SNAP_CASES for arm in ("plain", "recover")]
    run_job("noharm_snap_job.py", out, names, timeout_s=300)
    return out, rank_outputs(out, names)


@pytest.mark.parametrize("case", SNAP_CASES)
def test_snapshots_on_by_default_do_no_harm(snap_job, case):
    """Guard(recover=True), no `snapshot_every`: snapshots are on (a tiny model fits), taken before steps 1, 11
    and 21, and the run trains bit for bit as without lossguard, with no recovery event (StepLR found, LambdaLR
    given, a LoRA adapter on a frozen base, gradient accumulation 4)."""
    out, ranks = snap_job
    name = f"{case}-recover"
    assert _recoveries(out, name) == [], name
    for mine, plain in zip(ranks[name], ranks[f"{case}-plain"], strict=True):
        assert all(mine["commits"]) and mine["halted_at"] is None
        assert mine["losses"] == plain["losses"] and mine["lr"] == plain["lr"]
    assert _same_weights(out, name, f"{case}-plain"), name
    for r in (0, 1):
        (plan,) = [line for line in map(json.loads, (out / name / "events" / f"events-rank{r}.jsonl")
                                        .read_text().splitlines()) if line["type"] == "snapshots"]
        assert plan["every"] == 10 and plan["fits"] and plan["asked"] is None
    text = plan["text"]
    assert {"steplr": "the LR scheduler StepLR (found)", "lambdalr": "the LR scheduler LambdaLR,",
            "lora": "no LR scheduler", "ga4": "no LR scheduler"}[case] in text, text
    if case == "lora":  # the snapshot holds the adapter: a few KiB beside the frozen base's
        assert plan["bytes"] < 4 * sum(v.numel() for v in torch.load(out / name / "weights-rank0.pt").values())
