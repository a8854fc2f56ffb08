"""A cause is ranked from what this run's inputs show: `likely` needs one of its deciding facts, a cause none
of whose deciding facts is known is at most `possible` and the report says what would decide, a fact that
contradicts its mechanism makes it `unlikely`, and evidence is a fact with its location, never a link."""

import json
import re
from pathlib import Path

import pytest

from lossguard.api import analyze
from lossguard.diagnose.catalog import CAUSES
from lossguard.diagnose.diagnosis import deciding_facts
from lossguard.diagnose.ranking import rank_causes
from lossguard.knowledge.conditions import RunEvidence

ROOT = Path(__file__).resolve().parents[2]
REAL_LOGS = ROOT.parent / "shared" / "reallogs"
_LOCATION = re.compile(r"\[[^\]]+\]$")


def _by_id(causes):
    return {c.id: c for c in causes}


def test_symptoms_alone_never_make_a_cause_likely():
    # A gradient that went non-finite beside a finite loss fits the ZeRO-1/2 race, and nothing else is known:
    # the race ranks first, but the inputs do not show DeepSpeed, so it is only possible, and says what decides.
    run = RunEvidence(measured={("LOSS001", "loss_finite"): 1}, finding_origins={"LOSS001": "step 7"})
    ranked = rank_causes("nonfinite-hidden", run)
    assert ranked[0].id == "zero12-overlap-race"
    assert ranked[0].likelihood == "possible" and ranked[0].confidence >= 0.2
    assert "ZeRO stage" in ranked[0].to_dict()["decided_by"]
    assert deciding_facts(ranked) and "--config" in deciding_facts(ranked)[0]


def test_the_same_cause_is_likely_once_the_config_shows_its_mechanism():
    run = RunEvidence(facts={"zero_stage": 2, "overlap_comm": True}, origins={"zero_stage": "ds.json:4",
                                                                             "overlap_comm": "ds.json:6"},
                      measured={("LOSS001", "loss_finite"): 1}, finding_origins={"LOSS001": "step 7"})
    top = rank_causes("nonfinite-hidden", run)[0]
    assert (top.id, top.likelihood) == ("zero12-overlap-race", "likely")
    assert top.to_dict()["decided_by"] is None
    assert "ZeRO stage 2 (the races are in ZeRO-1/2) [ds.json:4]" in top.evidence


def test_a_fact_that_contradicts_the_mechanism_makes_it_unlikely_whatever_its_share():
    # Only fp16 causes explain an overflow storm; a run that shows bf16 cannot have an fp16 loss-scale storm.
    run = RunEvidence(facts={"bf16": True}, events={"overflow": 30}, origins={"bf16": "ds.json:2"})
    cause = _by_id(rank_causes("fp16-overflow", run))["fp16-activation-overflow"]
    assert cause.confidence >= 0.5 and cause.likelihood == "unlikely"
    assert any("bf16" in line and "[ds.json:2]" in line for line in cause.against)


def test_an_adapter_cause_needs_an_adapter_in_sight():
    ranked = rank_causes("no-grad-flow", RunEvidence())
    assert all(c.likelihood != "likely" for c in ranked)
    shown = rank_causes("no-grad-flow", RunEvidence(events={"no-input-grad": 2},
                                                    event_origins={"no-input-grad": "train.log:88"}))
    assert (shown[0].id, shown[0].likelihood) == ("lora-reentrant-checkpointing", "likely")
    assert any(line.endswith("[train.log:88]") for line in shown[0].evidence)


def test_a_zero_norm_beside_an_lr_at_zero_points_to_skipped_steps_not_a_missing_gradient():
    run = RunEvidence(measured={("GRAD002", "lr_zero"): 1}, finding_origins={"GRAD002": "step 3"})
    ranked = rank_causes("no-grad-flow", run)
    assert ranked[0].id == "fp16-activation-overflow" and ranked[0].likelihood == "possible"
    lora = _by_id(ranked).get("lora-reentrant-checkpointing")
    assert lora is None or any("skipped step" in line for line in lora.against)


def test_every_deciding_rule_says_how_to_supply_its_facts():
    for rule in CAUSES:
        assert not rule.shown_by or rule.decide, rule.id


def _real_cases():
    if not (REAL_LOGS / "labels.json").exists():
        return []
    return sorted(p for p in REAL_LOGS.iterdir() if (p / "case.json").exists())


@pytest.mark.skipif(not _real_cases(), reason=f"no real-log set at {REAL_LOGS}")
def test_on_real_logs_evidence_is_a_located_fact_and_every_likely_cause_cites_one():
    for case in _real_cases():
        logs = [str(p) for p in sorted(case.iterdir()) if p.is_file() and p.name not in ("case.json", "config.txt")]
        result = analyze(logs).to_dict()
        json.dumps(result)
        for cause in result["causes"]:
            lines = cause["evidence"] + cause["against"]
            assert not any("http" in line for line in lines), (case.name, cause["id"], lines)
            if cause["confidence"] == "likely":
                assert any(_LOCATION.search(line) for line in cause["evidence"]), (case.name, cause)
            if cause["confidence"] == "possible" and result["causes"][0] is cause and cause["decided_by"]:
                assert cause["decided_by"] in result["deciding_facts"]


def test_a_loss_that_was_steady_before_it_died_argues_against_an_unstable_update():
    steady = RunEvidence(steady_logs_before_onset=12, onset_origin="step 40")
    unsure = RunEvidence()
    for cause_id in ("numerical-nan", "lr-too-high"):
        before = _by_id(rank_causes("nonfinite", unsure))[cause_id].confidence
        after = _by_id(rank_causes("nonfinite", steady)).get(cause_id)
        assert after is None or (after.confidence < before and any("steady for 12 logs" in line and
                                                                   "[before step 40]" in line
                                                                   for line in after.against))


def test_fp32_shown_rules_out_the_fp16_overflow():
    run = RunEvidence(facts={"fp16": False, "bf16": False}, events={"lr-before-step": 5})
    cause = _by_id(rank_causes("lr-zero", run)).get("fp16-activation-overflow")
    assert cause is None or cause.likelihood == "unlikely"
