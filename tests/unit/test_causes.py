"""The cause catalog: typed conditions checked against what exists, every cause reachable (it ranks first on
the run evidence built for it), evidence against a cause shown and lowering it, rank words not percentages."""

import re
from pathlib import Path

import pytest

import lossguard
from lossguard.detectors import registered
from lossguard.diagnose.catalog import CAUSES
from lossguard.diagnose.ranking import rank_causes
from lossguard.knowledge import ISSUES
from lossguard.knowledge.conditions import Event, Fact, Fired, Measured, RunEvidence
from lossguard.sources.patterns import EVENT_PATTERNS

ZERO2 = {"zero_stage": 2, "overlap_comm": True, "world_size": 2}
# cause id -> (signature, the run evidence that should put it first)
SCENARIOS = {
    "zero12-overlap-race": ("nonfinite-hidden", RunEvidence(facts={**ZERO2, "deepspeed_version": "0.12.0"})),
    "zero12-multi-rank-bucket": ("nonfinite", RunEvidence(facts={
        **ZERO2, "deepspeed_version": "0.14.4", "use_multi_rank_bucket_allreduce": True})),
    "zero12-pingpong-index-reset": ("nonfinite-hidden", RunEvidence(facts={**ZERO2, "deepspeed_version": "0.17.3"})),
    "zero12-buffer-lifetime": ("nonfinite", RunEvidence(facts={**ZERO2, "deepspeed_version": "0.18.6", "num_nodes": 2,
                                                               "bf16": False})),
    "bf16-no-overflow-check": ("nonfinite-hidden", RunEvidence(facts={
        "zero_stage": 3, "bf16": True, "check_grad_overflow": False, "deepspeed_version": "0.16.0"})),
    "fp16-activation-overflow": ("fp16-overflow", RunEvidence(facts={"fp16": True}, events={"overflow": 12})),
    "attention-kernel-nan": ("nonfinite", RunEvidence(facts={"torch_version": "2.5.0", "zero_stage": 0},
                                                      events={"cudnn-sdpa": 1}, onset_at_start=True)),
    "lr-too-high": ("divergence", RunEvidence(fired={"LOSS005", "LOSS006"})),
    "masked-batch-nan": ("nonfinite", RunEvidence(facts={"zero_stage": 0, "bf16": False}, onset_at_start=True,
                                                  events={"tokenization-mismatch": 3})),
    "template-mismatch": ("masked-labels", RunEvidence(events={"tokenization-mismatch": 40})),
    "truncation-cuts-answers": ("masked-labels", RunEvidence(events={"response-key-missing": 8})),
    "image-token-mismatch": ("zero-loss", RunEvidence(events={"image-token-mismatch": 2})),
    "lora-reentrant-checkpointing": ("no-grad-flow", RunEvidence(facts={"gradient_checkpointing": True},
                                                                 events={"no-input-grad": 1})),
    "trainable-not-optimized": ("no-grad-flow", RunEvidence(events={"trainable-not-in-optimizer": 1})),
    "scheduler-not-stepping": ("lr-zero", RunEvidence(facts={"bf16": True}, events={"lr-before-step": 1})),
    "lr-too-small": ("not-learning", RunEvidence()),
    "weights-not-updating": ("not-learning", RunEvidence(fired={"LR001"})),
    "label-leakage": ("memorization", RunEvidence(measured={("LOSS007", "eval_ratio"): 0.02})),
    "benign-memorization": ("memorization", RunEvidence(measured={("LOSS007", "eval_ratio"): 1.4})),
    "replica-divergence": ("rank-desync", RunEvidence()),
    "numerical-nan": ("nonfinite", RunEvidence(facts={"fp16": True})),
    "eval-batch-nan": ("nonfinite", RunEvidence(measured={("LOSS001", "on_eval"): 1}, train_losses_finite=True)),
    "rl-zero-advantage": ("no-grad-flow", RunEvidence(measured={("GRAD006", "degenerate_rewards"): 1},
                                                      columns=frozenset({"reward_std", "kl"}))),
    "zero-grad-missing": ("divergence", RunEvidence(grad_norm_grows=True)),
    "framework-bf16-no-nan-check": ("nonfinite", RunEvidence(facts={"bf16": True},
                                                             events={"loss-field-vanished": 3})),
    "dpo-policy-equals-reference": ("not-learning", RunEvidence(margins_all_zero=True, loss_at_ln2=True,
                                                                columns=frozenset({"reward_margin"}))),
    "zero2-ga-last-microbatch": ("not-learning", RunEvidence(facts={
        "zero_stage": 2, "gradient_accumulation_steps": 4, "deepspeed_version": "0.18.0"})),
    "zero2-shared-loss-ga-scaling": ("divergence", RunEvidence(facts={
        "zero_stage": 2, "gradient_accumulation_steps": 4, "deepspeed_version": "0.19.0", "bf16": True,
        "world_size": 8})),
    "rl-update-lost": ("no-grad-flow", RunEvidence(measured={("GRAD006", "degenerate_rewards"): 0},
                                                   columns=frozenset({"reward_std", "kl"}),
                                                   facts={"gradient_checkpointing": False})),
}
# Causes no log fact tells from a rival: they are ranked, but never first. Each says what would decide.
NOT_FIRST_FROM_LOGS = {
    "rl-update-lost": "rewards that vary beside a zero gradient say the update was lost, not where: a LoRA adapter "
                      "without input gradients or parameters outside the optimizer lose it the same way",
    "truncation-cuts-answers": "TRL's 'Could not find response key' is printed for a template mismatch too; only "
                               "the tokenized lengths against max_length tell them apart, and no log shows them",
}


def test_every_cause_has_a_scenario():
    assert set(SCENARIOS) == {c.id for c in CAUSES}


@pytest.mark.parametrize("cause_id", sorted(SCENARIOS))
def test_each_cause_ranks_first_on_evidence_built_for_it(cause_id):
    signature, run = SCENARIOS[cause_id]
    ranked = rank_causes(signature, run)
    if cause_id in NOT_FIRST_FROM_LOGS:
        cause = next(c for c in ranked if c.id == cause_id)  # ranked, never ruled out, but not first
        assert cause.likelihood == "possible", cause
        return
    assert ranked[0].id == cause_id, [(c.id, round(c.confidence, 3)) for c in ranked]


def _conditions():
    return [clue for rule in CAUSES for clue, _ in rule.predicts]


def test_conditions_name_detectors_that_exist():
    codes = {f().code for f in registered()}
    used = {c.subject.code for c in _conditions() if isinstance(c.subject, (Fired, Measured))}
    assert used and used <= codes, used - codes


def _live_events() -> set[str]:
    """Event names the live monitor emits (`event("NAME", ...)` in monitor/)."""
    source = "".join(p.read_text() for p in (Path(lossguard.__file__).parent / "monitor").glob("*.py"))
    return set(re.findall(r'\bevent\("([a-z0-9-]+)"', source))


def _placed_events() -> set[str]:
    """Event names the step placer emits for what a reader found (`event="NAME"` in sources/placer.py)."""
    source = (Path(lossguard.__file__).parent / "sources" / "placer.py").read_text()
    return set(re.findall(r'\bevent="([a-z0-9-]+)"', source))


def test_conditions_name_events_the_sources_emit():
    emitted = {name for name, _ in EVENT_PATTERNS} | _live_events() | _placed_events()
    used = {c.subject.name for c in _conditions() if isinstance(c.subject, Event)}
    assert used and used <= emitted, used - emitted


def test_an_unknown_condition_key_fails_when_the_catalog_loads():
    with pytest.raises(ValueError, match="unknown run fact 'lora'"):
        Fact("lora")  # issue #13: the catalog tested "lora", which nothing sets
    with pytest.raises(ValueError, match="detector codes"):
        Fired("finding:LR001")
    with pytest.raises(ValueError, match="event names"):
        Event("event:overflow")


def test_every_cause_is_a_known_issue_and_no_title_cites_internal_notes():
    for rule in CAUSES:
        assert ISSUES[rule.id] is rule.issue
    for issue in ISSUES.values():
        text = " ".join([issue.title, issue.mechanism, issue.fix, issue.confirm, issue.config, issue.symptoms])
        assert "KNOWLEDGE" not in text and not re.search(r"\bB[1-8] window\b", text), issue.id


def test_facts_against_a_cause_are_shown_and_lower_it():
    facts = {**ZERO2, "deepspeed_version": "0.12.0"}
    base = {c.id: c for c in rank_causes("nonfinite-hidden", RunEvidence(facts=facts))}
    assert base["zero12-overlap-race"].against == []
    off = rank_causes("nonfinite-hidden", RunEvidence(facts={**facts, "overlap_comm": False}))
    race = next((c for c in off if c.id == "zero12-overlap-race"), None)
    assert race is None or ("overlap_comm is false" in " ".join(race.against)
                            and race.confidence < base["zero12-overlap-race"].confidence)
    assert off[0].id != "zero12-overlap-race"


def test_a_version_outside_the_window_and_a_cpu_build_count_against():
    new = rank_causes("nonfinite-hidden", RunEvidence(facts={**ZERO2, "deepspeed_version": "0.19.8"}))
    race = next(c for c in new if c.id == "zero12-overlap-race")
    assert any("outside the affected range" in line for line in race.against)
    assert not any("0.19.8" in line for line in race.evidence)
    cpu = RunEvidence(facts={"torch_version": "2.13.0+cpu", "zero_stage": 0}, onset_at_start=True)
    kernel = next((c for c in rank_causes("nonfinite", cpu) if c.id == "attention-kernel-nan"), None)
    assert kernel is None or any("CPU build" in line for line in kernel.against)


def test_json_shows_rank_words_not_percentages():
    signature, run = SCENARIOS["template-mismatch"]
    out = [c.to_dict() for c in rank_causes(signature, run)]
    assert out[0]["confidence"] == "likely" and {"id", "evidence", "against", "fix", "score"} <= set(out[0])
    assert all(c["confidence"] in ("likely", "possible", "unlikely") for c in out)


def test_lint_rules_read_known_issues_that_exist_and_explain_links_them():
    from lossguard.explain import explain
    from lossguard.lint.rules import all_rules

    linked = {issue: rule.code for rule in all_rules() for issue in rule.issues}
    assert linked and set(linked) <= set(ISSUES), set(linked) - set(ISSUES)
    assert "DSC101" in explain("zero12-overlap-race") and "ENV304" in explain("zero3-stream-race")
