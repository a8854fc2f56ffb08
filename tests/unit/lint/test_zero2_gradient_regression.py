"""DSC119 (ZeRO-2 gradient-correctness regressions): its windows, links and fixes are the known-issues table's;
clean on a fixed DeepSpeed, it names the affected releases at info level; the shared-loss window stays info."""

from __future__ import annotations

from lossguard.knowledge import deepspeed as kd
from lossguard.lint.api import lint
from lossguard.lint.rules import get_rule
from lossguard.lint.rules.base import fix_of

Z2_GA = {"zero_optimization": {"stage": 2}, "gradient_accumulation_steps": 8, "bf16": {"enabled": True}}


def _one(config, env, args=None, **options):
    found = lint(config, args, env, select=["DSC119"], options=options)
    assert len(found) <= 1, [f.message for f in found]
    return found[0] if found else None


def test_the_rule_reads_both_issues_from_the_table():
    rule = type(get_rule("DSC119"))
    assert rule.issues == (kd.ZERO2_GA_LAST_MICROBATCH.id, kd.ZERO2_SHARED_LOSS_GA.id)
    assert rule.evidence == (*kd.ZERO2_GA_LAST_MICROBATCH.sources, *kd.ZERO2_SHARED_LOSS_GA.sources)
    first = _one(Z2_GA, {"deepspeed": "0.18.2"})
    assert str(first.severity) == "warning" and fix_of(first).description == kd.ZERO2_GA_LAST_MICROBATCH.fix
    assert not fix_of(first).edits  # no config key fixes it: nothing for --fix to apply
    second = _one(Z2_GA, {"deepspeed": "0.19.5"})
    assert str(second.severity) == "info" and fix_of(second).description == kd.ZERO2_SHARED_LOSS_GA.fix


def test_window_edges_follow_the_releases():
    assert _one(Z2_GA, {"deepspeed": "0.17.5"}) is None
    assert str(_one(Z2_GA, {"deepspeed": "0.17.6"}).severity) == "warning"
    assert str(_one(Z2_GA, {"deepspeed": "0.18.3"}).severity) == "info"
    assert _one(Z2_GA, {"deepspeed": "0.19.6"}) is None


def test_clean_on_a_fixed_release_names_the_affected_ones():
    info = _one(Z2_GA, {"deepspeed": "0.19.8"}, other_versions=True)
    assert str(info.severity) == "info" and info.data["affected"] == ["DeepSpeed >= 0.17.6, < 0.18.3"]
    assert _one({**Z2_GA, "gradient_accumulation_steps": 1}, {"deepspeed": "0.19.8"}, other_versions=True) is None


def test_accumulation_from_the_training_arguments():
    auto = {**Z2_GA, "gradient_accumulation_steps": "auto"}
    assert _one(auto, {"deepspeed": "0.18.0"}, {"gradient_accumulation_steps": 1, "bf16": True}) is None
    found = _one(auto, {"deepspeed": "0.18.0"}, {"gradient_accumulation_steps": 16, "bf16": True})
    assert str(found.severity) == "warning" and "gradient_accumulation_steps 16" in found.message
