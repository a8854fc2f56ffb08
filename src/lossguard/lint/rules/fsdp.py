"""FSDP hazards under the HF Trainer / accelerate, read from the accelerate YAML, the Trainer's `fsdp` /
`fsdp_config`, axolotl / LLaMA-Factory YAMLs and the installed versions (lint/fsdp.py reads them all)."""

from __future__ import annotations

from collections.abc import Iterable

from lossguard.core.findings import Finding, Severity
from lossguard.knowledge import fsdp as kf
from lossguard.lint.context import LintContext
from lossguard.lint.rules.base import Example, Fix, Rule

_ACCELERATE = {"distributed_type": "FSDP", "mixed_precision": "bf16", "num_processes": 8}
_TRAINER_ARGS = {"output_dir": "out", "per_device_train_batch_size": 1}
_HF_FRAMEWORKS = ("axolotl", "llamafactory")


def _trainer_runs(ctx: LintContext) -> bool:
    """The HF Trainer (or axolotl / LLaMA-Factory on top of it) drives this FSDP run."""
    return ctx.fsdp is not None and ctx.fsdp.hf and (ctx.hf_trainer or ctx.arg("framework") in _HF_FRAMEWORKS)


class FsdpCheckpointingTwice(Rule):
    """FSDP activation checkpointing and the Trainer's gradient_checkpointing both on: no start-up.

    What: from transformers 4.35 the Trainer reads `activation_checkpointing` from its `fsdp_config` (or the
    accelerate plugin the launcher's YAML filled, `fsdp_activation_checkpointing`) and raises ValueError when
    `gradient_checkpointing` is also True (transformers PR #25771). The run dies before the first step.

    Fix (manual): keep FSDP's activation checkpointing and set gradient_checkpointing False (transformers
    #30404 / PR #31578: under FULL_SHARD the HF one re-gathers each layer in backward).
    """

    issues = (kf.CHECKPOINTING_TWICE.id,)
    engines = ("fsdp",)
    code = "FSD101"
    name = "fsdp.checkpointing-twice"
    severity = Severity.ERROR
    summary = "FSDP activation_checkpointing with the Trainer's gradient_checkpointing: ValueError at start-up"
    evidence = kf.CHECKPOINTING_TWICE.sources
    examples = (
        Example({**_ACCELERATE, "fsdp_config": {"fsdp_activation_checkpointing": True}}, valid=False,
                args={**_TRAINER_ARGS, "gradient_checkpointing": True}, env={"transformers": "4.46.0"}),
        Example({"fsdp": "full_shard auto_wrap", "fsdp_config": {"activation_checkpointing": True}}, valid=False,
                args={**_TRAINER_ARGS, "gradient_checkpointing": True}, env={"transformers": "4.57.0"},
                note="the Trainer's own fsdp_config"),
        Example({**_ACCELERATE, "fsdp_config": {"fsdp_activation_checkpointing": True}}, valid=True,
                args={**_TRAINER_ARGS, "gradient_checkpointing": False}, env={"transformers": "4.46.0"}),
        Example({**_ACCELERATE, "fsdp_config": {"fsdp_activation_checkpointing": False}}, valid=True,
                args={**_TRAINER_ARGS, "gradient_checkpointing": True}, env={"transformers": "4.46.0"}),
        Example({**_ACCELERATE, "fsdp_config": {"fsdp_activation_checkpointing": True}}, valid=True,
                args={"gradient_checkpointing": True, "launcher": "accelerate"}, env={"transformers": "4.46.0"},
                note="a plain accelerate script: its own flag, no Trainer check"),
    )

    def check(self, ctx: LintContext) -> Iterable[Finding]:
        view = ctx.fsdp
        if view is None or not view.get("activation_checkpointing") or ctx.arg("gradient_checkpointing") is not True:
            return
        version = ctx.version("transformers")
        if not _trainer_runs(ctx) or not kf.CHECKPOINTING_TWICE.affects("transformers", version):
            return
        path = view.path("activation_checkpointing")
        yield self.finding(ctx, f"{path} is true and gradient_checkpointing is True: transformers {version} raises "
                           "ValueError before the first step (the two cannot both be on under FSDP)", path,
                           fix=Fix(kf.CHECKPOINTING_TWICE.fix, safe=True))


class FsdpPeftFlatParams(Rule):
    """FSDP1, use_orig_params false, LoRA, transformers < 4.39: the model cannot be wrapped.

    What: with `use_orig_params: false` each FSDP unit is one FlatParameter that must be all trainable or
    all frozen; a decoder layer with frozen base weights and LoRA weights fails with "Must flatten tensors
    with uniform requires_grad" (pytorch #104690, peft #1702). From transformers 4.39 the Trainer wraps a
    LoRA model with PEFT's auto-wrap policy, so each LoRA layer is its own unit (PR #29587); FSDP2 has no
    FlatParameter. Only an explicit `use_orig_params: false` is flagged (the defaults differ by release).

    Fix (manual): `fsdp_use_orig_params: true`, or transformers >= 4.39.
    """

    issues = (kf.PEFT_FLAT_PARAMS.id,)
    engines = ("fsdp",)
    code = "FSD102"
    name = "fsdp.peft-flat-params"
    severity = Severity.ERROR
    summary = "FSDP1 use_orig_params false with LoRA on transformers < 4.39: ValueError at wrapping"
    evidence = kf.PEFT_FLAT_PARAMS.sources
    _cfg = {**_ACCELERATE, "fsdp_config": {"fsdp_use_orig_params": False,
                                           "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP"}}
    examples = (
        Example(_cfg, valid=False, args={**_TRAINER_ARGS, "lora": True}, env={"transformers": "4.38.2"}),
        Example(_cfg, valid=True, args={**_TRAINER_ARGS, "lora": True}, env={"transformers": "4.39.0"}),
        Example(_cfg, valid=True, args={**_TRAINER_ARGS}, env={"transformers": "4.38.2"}, note="full fine-tune"),
        Example({**_cfg, "fsdp_config": {"fsdp_use_orig_params": True}}, valid=True,
                args={**_TRAINER_ARGS, "lora": True}, env={"transformers": "4.38.2"}),
        Example({**_cfg, "fsdp_config": {"fsdp_use_orig_params": False, "fsdp_version": 2}}, valid=True,
                args={**_TRAINER_ARGS, "lora": True}, env={"transformers": "4.38.2"}, note="FSDP2"),
    )

    def check(self, ctx: LintContext) -> Iterable[Finding]:
        view = ctx.fsdp
        if view is None or view.version != 1 or view.get("use_orig_params") is not False or not ctx.arg("lora"):
            return
        version = ctx.version("transformers")
        if not _trainer_runs(ctx) or not kf.PEFT_FLAT_PARAMS.affects("transformers", version):
            return
        path = view.path("use_orig_params")
        yield self.finding(ctx, f"{path} is false with a LoRA adapter on transformers {version}: FSDP cannot flatten "
                           "a layer holding frozen and trainable weights (ValueError before the first step)", path,
                           fix=Fix(kf.PEFT_FLAT_PARAMS.fix, safe=True))
