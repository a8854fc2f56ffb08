"""Lint over the configs people ship (../shared/realconfigs, 89 files from 13 repositories; skipped where the
folder is absent): no internal error, exit-2 input only for the three placeholder templates, every
accelerate YAML read, and the issue #15 rules fire on the real configs that have their hazard."""

from __future__ import annotations

from pathlib import Path

import pytest

from lossguard.lint.api import lint_context, run_rules
from lossguard.lint.document import ConfigError, read_document
from lossguard.lint.routes import follow

REAL = Path(__file__).resolve().parents[2] / ".." / "shared" / "realconfigs"
pytestmark = pytest.mark.skipif(not REAL.is_dir(), reason="../shared/realconfigs is not here")
OLD = {"deepspeed": "0.12.6", "transformers": "4.47.0", "torch": "2.1.2"}
NEW = {"deepspeed": "0.19.8", "transformers": "4.57.0", "torch": "2.9.0"}


def _files():
    """The DeepSpeed and accelerate configs: files at the top (the `fsdp/` folder beside them holds FSDP
    configs, which this linter's DeepSpeed rules do not read)."""
    return sorted(p for p in REAL.glob("*") if p.is_file() and p.name != "README.md") if REAL.is_dir() else []


def _codes(name: str, env: dict, args: dict | None = None, **options) -> dict[str, str]:
    route = follow(read_document(str(REAL / name)))
    merged = {"origin": "test", "framework": "hf", **route.launch, **(args or {})} if (args or route.launch) else None
    ctx = lint_context(route.doc.data, merged, env, options={"route_unread": route.unread, **options})
    return {f.code: str(f.severity) for f in run_rules(ctx)}


def test_every_real_config_lints_and_only_templates_are_unreadable():
    unreadable = []
    for path in _files():
        try:
            route = follow(read_document(str(path)))
        except ConfigError:
            unreadable.append(path.name)
            continue
        assert route.recognised, path.name
        for env in (OLD, NEW):
            run_rules(lint_context(route.doc.data, route.launch or None, env, options={"other_versions": True}))
    assert len(unreadable) == 3 and all("TEMPLATE" in name for name in unreadable), unreadable


def test_every_accelerate_yaml_is_read():
    yamls = [p for p in _files() if p.suffix in (".yaml", ".yml")]
    assert len(yamls) == 4
    for path in yamls:
        route = follow(read_document(str(path)))
        assert route.how.startswith("accelerate YAML") and route.launch.get("world_size")
        assert route.synthesized or route.unread is None


@pytest.mark.parametrize(("name", "env", "code", "severity"), [
    ("deepspeedai__DeepSpeedExamples__training__BingBertSquad__1-bit_adam__nccl__"
     "deepspeed_onebitadam_bsz96_config.json", NEW, "DSC117", "error"),
    ("OpenGVLab__InternVL__segmentation__zero_configs__adam_zero1_amp.json", NEW, "DSC004", "error"),
    ("bigscience-workshop__Megatron-DeepSpeed__tests__ds_config_cl.json", NEW, "DSC004", "error"),
    ("OpenGVLab__InternVL__internvl_chat_llava__scripts__zero2.json", OLD, "DSC115", "warning"),
    ("axolotl-ai-cloud__axolotl__deepspeed_configs__zero3.json", NEW, "DSC118", "warning"),
    ("huggingface__accelerate__examples__deepspeed_config_templates__zero_stage3_config.json", NEW, "DSC118", "info"),
    ("OpenBMB__MiniCPM-V__finetune__ds_config_zero2.json", NEW, "DSC101", "info"),  # safe here, 0.12.6 not
])
def test_issue_15_rules_fire_on_the_real_configs_with_the_hazard(name, env, code, severity):
    assert _codes(name, env, other_versions=True).get(code) == severity


def test_scheduler_block_with_cosine_asked_for():
    name = "huggingface__accelerate__examples__deepspeed_config_templates__zero_stage2_config.json"
    args = {"per_device_train_batch_size": 4, "lr_scheduler_type": "cosine"}
    assert _codes(name, NEW, args)["DSC116"] == "warning"  # WarmupDecayLR is linear decay, not cosine
    assert "DSC116" not in _codes(name, NEW, {**args, "lr_scheduler_type": "linear"})


def test_no_dsc111_error_without_a_world_size_that_refuses():
    for path in _files():
        try:
            route = follow(read_document(str(path)))
        except ConfigError:
            continue
        codes = {f.code for f in run_rules(lint_context(route.doc.data, route.launch or None, NEW))}
        assert "DSC111" not in codes, path.name
