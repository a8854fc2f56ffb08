"""The commit gate inside `transformers.Trainer` (`LossguardCallback(recover=...)`): two real ranks over gloo,
under DeepSpeed ZeRO-1/2/3 and without DeepSpeed (DDP). A held step leaves each rank's state as it was (the
Trainer's LR scheduler included), the budget falls back to the Trainer saving a checkpoint and stopping, a
healthy run trains and logs exactly as without lossguard, and nothing hangs."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")
pytest.importorskip("transformers")

from tests.integration.live_helpers import run_job  # noqa: E402
from tests.integration.test_live_ds_recover import _analyze_json, _same  # noqa: E402

pytestmark = pytest.mark.integration

NAN_STEP = 4
HELD = ["z1-nan_once", "z2-nan_once", "z3-nan_once", "ddp-nan_once"]
SCENARIOS = [*HELD, "z2-over_budget", "ddp-over_budget", "z3-healthy", "z3-plain", "ddp-healthy", "ddp-plain"]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    out = tmp_path_factory.mktemp("hf_recover")
    run_job("hf_recover_job.py", out, SCENARIOS, timeout_s=900)  # a hang fails here, at the timeout
    ranks = {name: [json.loads((out / name / f"rank{r}.json").read_text()) for r in (0, 1)] for name in SCENARIOS}
    summaries = {name: json.loads((out / name / "summary.json").read_text()) for name in SCENARIOS}
    return out, ranks, summaries


@pytest.mark.parametrize("scenario", HELD)
def test_a_faulty_step_is_held_on_every_rank_and_leaves_the_state_as_it_was(job, scenario):
    out, ranks, _ = job
    for rank in ranks[scenario]:
        assert rank["halted_at"] is None and rank["global_step"] == 8  # the Trainer counts the held step
    for r in (0, 1):
        before = torch.load(out / scenario / f"before-rank{r}.pt", weights_only=False)
        after = torch.load(out / scenario / f"after-rank{r}.pt", weights_only=False)
        before.pop("counters"), after.pop("counters")
        if not scenario.startswith("ddp"):  # DeepSpeed's optimizer says its last step was skipped
            assert before["optimizer"].pop("overflow") is False and after["optimizer"].pop("overflow") is True
        assert _same(before, after) >= 20  # weights, optimizer (Adam moments and step), both schedulers
    recoveries = _analyze_json(out / scenario / "events")["recoveries"]
    assert [(r["step"], r["ranks"], r["kind"], r["signature"]) for r in recoveries] == \
        [(NAN_STEP, [1], "held", "nonfinite")]


@pytest.mark.parametrize("stack", ["z2", "ddp"])
def test_past_the_budget_the_trainer_saves_a_checkpoint_and_stops(job, stack):
    out, ranks, summaries = job
    name = f"{stack}-over_budget"
    for rank in ranks[name]:
        assert rank["halted_at"] == 5 and rank["global_step"] == 5
    assert "checkpoint-5" in summaries[name]["checkpoints"]
    report = _analyze_json(out / name / "events")
    assert [r["step"] for r in report["recoveries"]] == [3, 4]
    assert report["verdict"] == "broken" and report["signature"] == "nonfinite"


@pytest.mark.parametrize("stack", ["z3", "ddp"])
def test_a_healthy_run_with_recover_trains_and_logs_exactly_as_without_lossguard(job, stack):
    out, ranks, summaries = job
    guarded, plain = f"{stack}-healthy", f"{stack}-plain"
    for r in (0, 1):
        assert ranks[guarded][r]["losses"] == ranks[plain][r]["losses"]
    assert summaries[guarded]["logged"] == summaries[plain]["logged"] and len(summaries[plain]["logged"]) == 8
    report = _analyze_json(out / guarded / "events")
    assert report["recoveries"] == [] and report["verdict"] == "healthy"
