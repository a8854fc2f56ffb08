"""The commit gate (`recover=True`) in a real two-rank DDP loop over gloo: a held step leaves no trace, the
budget falls back to the halt, a healthy run trains exactly as without lossguard, nothing hangs."""

from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch")

from tests.integration.live_helpers import analyze_json, rank_outputs, run_job  # noqa: E402

SCENARIOS = ["nan_once", "over_budget", "jump", "healthy", "plain"]
NAN_STEP = 4
JUMP_STEPS, JUMP_STEP = 30, 26  # recover_job.py: rank 1's loss x50 at JUMP_STEP


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    out = tmp_path_factory.mktemp("recover")
    run_job("recover_job.py", out, SCENARIOS, timeout_s=300)  # (d): a hang fails here, at the timeout
    ranks = rank_outputs(out, SCENARIOS)
    return out, ranks



def test_nan_on_one_rank_is_held_on_both_and_leaves_no_trace(job):
    out, ranks = job
    for rank in ranks["nan_once"]:
        assert rank["commits"] == [step != NAN_STEP for step in range(1, 13)]
        assert rank["grads_dropped"] == [True] and rank["halted_at"] is None
    assert math.isnan(ranks["nan_once"][1]["losses"][NAN_STEP - 1])
    for r in (0, 1):
        before = torch.load(out / "nan_once" / f"before-rank{r}.pt", weights_only=False)
        after = torch.load(out / "nan_once" / f"after-rank{r}.pt", weights_only=False)
        for key, value in before["model"].items():
            assert torch.equal(value, after["model"][key]), key
        assert before["scheduler"] == after["scheduler"]
        old, new = before["optimizer"]["state"], after["optimizer"]["state"]
        assert old.keys() == new.keys() and old
        for index, moments in old.items():  # Adam's step count and both moments, bit for bit
            for name, value in moments.items():
                assert torch.equal(value, new[index][name]), (index, name)
    # the run went on training after the held step: the weights of the last step moved from the held one
    assert ranks["nan_once"][0]["losses"][-1] != ranks["healthy"][0]["losses"][-1]


def test_analyze_lists_the_recovery_and_warns(job):
    out, _ = job
    report = analyze_json(out / "nan_once" / "events")
    assert report["recoveries"] == [{
        "step": NAN_STEP, "ranks": [1], "kind": "held", "samples": [], "steps_lost": 1,
        "signature": "nonfinite", "code": "LOSS001", "action": report["recoveries"][0]["action"]}]
    assert report["recoveries"][0]["action"].startswith("held")
    assert report["verdict"] == "warning"
    assert [f["code"] for f in report["findings"] if f["severity"] != "info"] == ["REC001"]
    live = json.loads((out / "nan_once" / "summary.json").read_text())["findings"]
    assert [f for f in live if f["severity"] != "info"] == []  # the held step reached no detector, live or after


def test_past_the_budget_the_run_halts_on_every_rank(job):
    out, ranks = job
    for rank in ranks["over_budget"]:
        assert rank["commits"] == [True, True, False, False] and rank["halted_at"] == 5
    report = analyze_json(out / "over_budget" / "events")
    assert [r["step"] for r in report["recoveries"]] == [3, 4]
    assert report["verdict"] == "broken" and report["signature"] == "nonfinite"
    halts = [json.loads(line) for line in (out / "over_budget" / "events" / "events-rank1.jsonl").read_text().splitlines()]
    assert [h for h in halts if h["type"] == "halt"] == [{"type": "halt", "step": 5, "codes": ["LOSS001"],
                                                           "reason": "recovery-budget"}]


def test_healthy_run_trains_exactly_as_without_lossguard(job):
    out, ranks = job
    for guarded, plain in zip(ranks["healthy"], ranks["plain"], strict=True):
        assert guarded["losses"] == plain["losses"] and all(guarded["commits"])
    assert analyze_json(out / "healthy" / "events")["recoveries"] == []


def test_every_rank_made_the_same_collectives(job):
    _, ranks = job
    for name in ("nan_once", "over_budget", "jump", "healthy"):
        assert ranks[name][0]["steps_by_path"] == ranks[name][1]["steps_by_path"], name


def test_a_loss_jump_on_one_rank_is_held_on_both_and_the_run_goes_on(job):
    out, ranks = job
    for rank in ranks["jump"]:
        assert rank["commits"] == [step != JUMP_STEP for step in range(1, JUMP_STEPS + 1)]
        assert rank["grads_dropped"] == [True] and rank["halted_at"] is None
    jumped, other = ranks["jump"][1]["losses"][JUMP_STEP - 1], ranks["jump"][0]["losses"][JUMP_STEP - 1]
    assert jumped > 20 * other  # the fault really was there, and finite
    report = analyze_json(out / "jump" / "events")
    assert [(r["step"], r["ranks"], r["kind"], r["signature"], r["code"]) for r in report["recoveries"]] == [
        (JUMP_STEP, [1], "held", "loss-spike", "LOSS006")]
    lines = [json.loads(line) for r in (0, 1)
             for line in (out / "jump" / "events" / f"events-rank{r}.jsonl").read_text().splitlines()]
    held = [line for line in lines if line["type"] == "recovery"]
    assert len(held) == 2  # written by each rank
    fault = held[0]["faults"][0]
    assert fault["fault"].startswith("loss jump") and fault["loss"] == jumped
    assert fault["typical"] < fault["limit"] < jumped and fault["spread"] >= 0
    # no step but the jump was held, and the run trained as the healthy one up to the jump
    for jump, healthy in zip(ranks["jump"], ranks["healthy"], strict=True):
        assert jump["losses"][:len(healthy["losses"])] == healthy["losses"]
