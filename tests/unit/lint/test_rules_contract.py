"""Registry contract: every rule has a unique code and name, docs, evidence, examples that pass, and
survives odd configs. The examples are the rules' own tests (STYLE.md 3, 9)."""

from __future__ import annotations

import re

import pytest

from lossguard.core.findings import Severity
from lossguard.lint.api import lint
from lossguard.lint.fix import apply_to_dict
from lossguard.lint.rules import RULES, all_rules, get_rule, select_rules
from lossguard.lint.rules.base import fix_of

RULE_IDS = [cls.code for cls in RULES]
EXAMPLES = [(cls, i) for cls in RULES for i in range(len(cls.examples))]


def test_codes_and_names_unique_and_well_formed():
    codes = [r.code for r in all_rules()]
    names = [r.name for r in all_rules()]
    assert len(set(codes)) == len(codes)
    assert len(set(names)) == len(names)
    for rule in all_rules():
        assert re.fullmatch(r"(DSC|HFA|ENV|FSD)\d{3}", rule.code)
        assert re.fullmatch(r"[a-z0-9]+(\.[a-z0-9-]+)+", rule.name)
        assert isinstance(rule.severity, Severity)


@pytest.mark.parametrize("code", RULE_IDS)
def test_rule_has_docs_evidence_examples(code):
    rule = get_rule(code)
    assert rule is not None and get_rule(rule.name).code == code
    assert len(rule.doc()) > 80 and "Fix" in rule.doc()
    assert rule.summary and rule.evidence
    assert all(link.startswith("https://") for link in rule.evidence)
    assert any(ex.valid for ex in rule.examples) and any(not ex.valid for ex in rule.examples)


@pytest.mark.parametrize(("cls", "index"), EXAMPLES, ids=[f"{c.code}-{i}" for c, i in EXAMPLES])
def test_examples(cls, index):
    example = cls.examples[index]
    if example.options.get("deepspeed_schema"):
        pytest.importorskip("deepspeed")
    findings = lint(example.config, example.args, example.env, select=[cls.code], options=example.options)
    assert all(f.code == cls.code for f in findings)
    if example.valid:
        assert findings == [], [f.message for f in findings]
        return
    assert findings, f"{cls.code} example {index} should be flagged"
    for f in findings:
        assert f.message and f.location is not None
    if example.fixed is not None:
        edits = [e for f in findings for e in (fix_of(f).edits if fix_of(f) else ())]
        fixed = apply_to_dict(example.config, edits)
        assert fixed == example.fixed
        again = lint(fixed, example.args, example.env, select=[cls.code], options=example.options)
        assert not [f for f in again if fix_of(f) and fix_of(f).edits], "fix must clear its own finding"


ODD_CONFIGS = [
    {},
    {"zero_optimization": None},
    {"zero_optimization": "2"},
    {"zero_optimization": [1, 2]},
    {"zero_optimization": {"stage": "two", "overlap_comm": "yes", "reduce_bucket_size": "big"}},
    {"zero_optimization": {"stage": 7}},
    {"bf16": True, "fp16": "on", "communication_data_type": 32},
    {"bf16": {"enabled": "auto", "check_grad_overflow": "auto"}, "fp16": {"enabled": None}},
    {"train_batch_size": "32", "train_micro_batch_size_per_gpu": 0, "gradient_accumulation_steps": -1},
    {"scheduler": {"params": "x"}, "optimizer": [], "gradient_clipping": "none"},
    {"scheduler": {"params": {"warmup_num_steps": "auto", "total_num_steps": "auto"}}},
    {k: "auto" for k in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                         "gradient_clipping", "bf16", "fp16", "zero_optimization", "steps_per_print")},
    {"zero_optimization": {k: "auto" for k in ("stage", "overlap_comm", "reduce_bucket_size",
                                                "use_multi_rank_bucket_allreduce", "stage3_prefetch_bucket_size")},
     "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"}},
]
ODD_ARGS = [None, {}, {"world_size": 0, "per_device_train_batch_size": "x", "model_name_or_path": 3},
            {"bf16": "maybe", "warmup_ratio": "lots", "gradient_checkpointing_kwargs": "not json", "lora": True,
             "gradient_checkpointing": True}]
ODD_ENVS = [{}, {"deepspeed": "garbage", "torch": "", "transformers": "4.x"}, {"deepspeed": "0.12.6", "torch": "2.5.0"}]


@pytest.mark.parametrize("config", ODD_CONFIGS)
@pytest.mark.parametrize("args", ODD_ARGS)
@pytest.mark.parametrize("env", ODD_ENVS)
def test_every_rule_survives_odd_input(config, args, env):
    for rule in all_rules():
        from lossguard.lint.api import lint_context

        ctx = lint_context(config, args, env)
        for finding in rule.check(ctx):
            assert finding.code == rule.code and isinstance(finding.message, str)


def test_wrong_types_are_reported():
    codes = {f.code for f in lint({"zero_optimization": {"stage": "2", "overlap_comm": "false"}}, env={})}
    assert "DSC001" in codes


def test_select_and_ignore():
    assert {r.code for r in select_rules(["DSC1"])} == {c for c in RULE_IDS if c.startswith("DSC1")}
    assert [r.code for r in select_rules(["zero.overlap-comm"])] == ["DSC101"]
    assert [r.code for r in select_rules(["zero"])] == ["DSC101", "DSC102", "DSC103", "DSC104"]
    assert "DSC101" not in {r.code for r in select_rules(None, ["DSC101"])}
    assert get_rule("nope") is None
