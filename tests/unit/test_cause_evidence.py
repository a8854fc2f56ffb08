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


def test_the_same_cause_is_likely_once_the_config_shows_what_only_it_predicts():
    # ZeRO-2 with overlap_comm: every ZeRO-1/2 race predicts both, so they decide nothing between them. A
    # DeepSpeed release of the three with the IPG index reset (few runs use them, the other races' windows
    # do not single them out) decides.
    origins = {"zero_stage": "ds.json:4", "overlap_comm": "ds.json:6", "deepspeed_version": "pip-freeze.txt:12"}
    facts = {"zero_stage": 2, "overlap_comm": True}
    undecided = rank_causes("nonfinite-hidden", RunEvidence(facts=facts, origins=origins))[0]
    assert undecided.likelihood == "possible" and "DeepSpeed version" in undecided.to_dict()["decided_by"]
    assert "ZeRO stage" not in undecided.to_dict()["decided_by"]  # never asks for what the report shows
    run = RunEvidence(facts={**facts, "deepspeed_version": "0.17.3"}, origins=origins)
    top = rank_causes("nonfinite-hidden", run)[0]
    assert (top.id, top.likelihood) == ("zero12-pingpong-index-reset", "likely")
    assert top.to_dict()["decided_by"] is None
    assert "overlap_comm is true [ds.json:6]" in top.evidence
    assert any(line.startswith("DeepSpeed 0.17.3 is in the affected range") for line in top.evidence)


def test_a_fact_that_contradicts_the_mechanism_makes_it_unlikely_whatever_its_share():
    # An fp16 loss-scale storm needs fp16: a run that shows bf16 cannot have one, and the cause goes last.
    run = RunEvidence(facts={"bf16": True}, events={"overflow": 30}, origins={"bf16": "ds.json:2"})
    ranked = rank_causes("fp16-overflow", run)
    cause = _by_id(ranked)["fp16-activation-overflow"]
    assert cause.likelihood == "unlikely" and ranked[-1] is cause
    assert any("bf16" in line and "[ds.json:2]" in line for line in cause.against)


def test_an_adapter_cause_needs_an_adapter_in_sight():
    ranked = rank_causes("no-grad-flow", RunEvidence())
    assert all(c.likelihood != "likely" for c in ranked)
    shown = rank_causes("no-grad-flow", RunEvidence(events={"no-input-grad": 2},
                                                    event_origins={"no-input-grad": "train.log:88"}))
    assert (shown[0].id, shown[0].likelihood) == ("lora-reentrant-checkpointing", "likely")
    assert any(line.endswith("[train.log:88]") for line in shown[0].evidence)


def test_a_zero_norm_beside_an_lr_stuck_at_zero_points_to_skipped_steps_not_a_missing_gradient():
    run = RunEvidence(zero_norm_at_zero_lr=True)
    ranked = rank_causes("no-grad-flow", run)
    assert ranked[0].id == "fp16-activation-overflow"
    lora = _by_id(ranked)["lora-reentrant-checkpointing"]
    assert lora.likelihood == "unlikely" and any("no step has been taken" in line for line in lora.against)
    # the same norm beside an LR that moves is no sign of a skipped step: it is not asked about
    assert rank_causes("no-grad-flow", RunEvidence(zero_norm_at_zero_lr=None))[0].id != "fp16-activation-overflow"


def test_every_cause_says_what_would_decide_it():
    for rule in CAUSES:
        assert rule.asks and all(ask.text for ask in rule.asks), rule.id


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


def test_a_loss_that_was_steady_before_it_died_argues_against_a_learning_rate_too_high():
    steady = RunEvidence(steady_logs_before_onset=12, onset_origin="step 40")
    before = _by_id(rank_causes("nonfinite", RunEvidence()))["lr-too-high"].confidence
    after = _by_id(rank_causes("nonfinite", steady)).get("lr-too-high")
    assert after is None or (after.confidence < before and any("steady for 12 logs" in line and
                                                               "[before step 40]" in line for line in after.against))


def test_fp32_shown_rules_out_the_fp16_overflow():
    run = RunEvidence(facts={"fp16": False, "bf16": False}, events={"lr-before-step": 5})
    cause = _by_id(rank_causes("lr-zero", run)).get("fp16-activation-overflow")
    assert cause is None or cause.likelihood == "unlikely"


def test_a_token_accuracy_of_zero_from_the_first_log_points_to_masked_labels(tmp_path):
    """TRL's SFT logs mean_token_accuracy 0.0 when no token of a batch is supervised; pretrained weights score
    above 0 on any supervised token. A NaN run whose accuracy is 0 from its first log had nothing to learn from;
    its twin, whose first logs score tokens before the NaN, does not point there."""
    def log(accuracies):
        rows = [f"{{'loss': {loss}, 'grad_norm': {grad}, 'learning_rate': 2e-05, 'mean_token_accuracy': {acc}, "
                f"'num_tokens': {256.0 * (i + 1)}, 'epoch': {0.01 * (i + 1):.2f}}}"
                for i, (loss, grad, acc) in enumerate(accuracies)]
        path = tmp_path / "train.log"
        path.write_text("\n".join(rows) + "\n")
        return analyze([str(path)]).to_dict()

    masked = log([(0.0, "nan", 0.0)] * 6)
    assert masked["causes"][0]["id"] == "masked-batch-nan", masked["causes"][:2]
    assert any("no supervised token was scored" in line for line in masked["causes"][0]["evidence"])
    twin = log([(round(1.9 - 0.05 * i, 3), 1.2, 0.55) for i in range(6)] + [(0.0, "nan", 0.0)] * 6)
    assert twin["causes"][0]["id"] != "masked-batch-nan", twin["causes"][:2]
