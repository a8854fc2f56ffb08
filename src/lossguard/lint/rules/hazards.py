"""Configs that silently change what the script asked for, or that DeepSpeed refuses at start-up (issue #15).

Mechanisms were read in the installed transformers 5.24 / accelerate 1.15 / DeepSpeed 0.19.8 and in the
DeepSpeed 0.12.6, 0.19.4, 0.19.6 and 0.19.7 sdists; the clipping and scheduler ones are confirmed by a real
two-rank Trainer run (tests/integration/test_lint_hazards_real.py).
"""

from __future__ import annotations

from collections.abc import Iterable

from lossguard.core.findings import Finding, Severity
from lossguard.knowledge import deepspeed as kd
from lossguard.lint.context import LintContext, as_bool, as_number
from lossguard.lint.rules.base import Example, Fix, Rule, delete, set_

DS = "https://github.com/deepspeedai/DeepSpeed"
HF_DS = "https://github.com/huggingface/transformers/blob/main/src/transformers/integrations/deepspeed.py"
_HF = {"per_device_train_batch_size": 4}


class ClippingDropped(Rule):
    """HF Trainer with no `gradient_clipping` key: `--max_grad_norm` is silently dropped.

    What: the HF integration fills only keys the config has (`fill_match("gradient_clipping", max_grad_norm)`
    does nothing when the key is absent), and under DeepSpeed the Trainer leaves clipping to the engine
    (accelerate's `clip_grad_norm_` only returns DeepSpeed's norm). DeepSpeed's own default then applies:
    0 (no clipping at all) up to 0.19.2, a fixed 1.0 from 0.19.3, whatever `--max_grad_norm` says. A real
    two-rank run on 0.19.8 with `--max_grad_norm 1e-3` clipped at 1.0 (update 0.81 vs 0.0049 with the key).
    fp16 configs get DSC108.

    Fix (unsafe: the run starts clipping): `"gradient_clipping": "auto"` (filled from --max_grad_norm). With
    the DeepSpeed version unknown it is an info without an automatic fix.
    """

    issues = ("hf-clipping-dropped",)
    code = "DSC115"
    name = "trainer.clipping-dropped"
    severity = Severity.WARNING
    summary = "no gradient_clipping key under the HF Trainer: --max_grad_norm is silently dropped"
    root_cause = "DSC108"  # fp16 without clipping: DSC108 says it
    evidence = (HF_DS, "https://github.com/huggingface/accelerate/blob/main/src/accelerate/accelerator.py")
    _cfg = {"bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": "auto"}
    examples = (
        Example(_cfg, valid=False, env={"deepspeed": "0.14.4"}, fixed={**_cfg, "gradient_clipping": "auto"},
                note="no clipping at all before 0.19.3"),
        Example({"zero_optimization": {"stage": 2}}, valid=False, args={**_HF, "max_grad_norm": 0.5, "bf16": True},
                env={"deepspeed": "0.19.8"}, fixed={"zero_optimization": {"stage": 2}, "gradient_clipping": "auto"},
                note="0.19.3+ clips at its own 1.0"),
        Example(_cfg, valid=True, env={"deepspeed": "0.19.8"}, note="default max_grad_norm 1.0 = DeepSpeed's 1.0"),
        Example({**_cfg, "gradient_clipping": "auto"}, valid=True, env={"deepspeed": "0.14.4"}),
        Example({"zero_optimization": {"stage": 2}}, valid=True, args={**_HF, "max_grad_norm": 0},
                env={"deepspeed": "0.14.4"}),
        Example({"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 4}, valid=True,
                note="no sign of the HF Trainer: DeepSpeed's own loop clips as configured"),
    )

    def check(self, ctx: LintContext) -> Iterable[Finding]:
        if not ctx.hf_trainer or "gradient_clipping" in ctx.raw:
            return
        wanted = (as_number(ctx.arg("max_grad_norm", 1.0)) if ctx.hf_args else 1.0) or 0.0
        given = "--max_grad_norm" if ctx.hf_args and "max_grad_norm" in (ctx.args or {}) else "max_grad_norm (default)"
        old_default = kd_clip_default_zero(ctx)
        if old_default is False and wanted == 1.0:  # 0.19.3+ clips at 1.0: what the default asks for
            return
        if old_default is not False and wanted <= 0:  # no clipping asked, none done
            return
        done = {True: "no clipping at all (DeepSpeed's default 0 before 0.19.3)",
                False: "clipping at DeepSpeed's own default 1.0 (0.19.3 and later)",
                None: "DeepSpeed's default: no clipping before 0.19.3, 1.0 from 0.19.3 (version unknown)"}[old_default]
        edits = (set_("gradient_clipping", "auto"),) if old_default is not None else ()  # unknown: a possibility
        fix = Fix('set gradient_clipping to "auto" (the Trainer fills it from --max_grad_norm)', safe=False,
                  edits=edits)
        yield self.finding(ctx, f"no gradient_clipping key: the HF Trainer fills only keys that exist and leaves "
                           f"clipping to DeepSpeed, so {given} {wanted:g} is silently dropped: {done}",
                           "gradient_clipping", fix=fix, severity=None if old_default is not None else Severity.INFO)


def kd_clip_default_zero(ctx: LintContext) -> bool | None:
    """Is DeepSpeed's default gradient_clipping 0 at the assumed version (1.0 from 0.19.3)? None: unknown."""
    return ctx.in_range("deepspeed", None, "0.19.3")


# DeepSpeed scheduler type -> the HF lr_scheduler_type with the same shape (None: no HF equivalent).
_SAME_SHAPE = {"warmuplr": "constant_with_warmup", "warmupdecaylr": "linear", "warmupcosinelr": "cosine",
               "onecycle": None, "lrrangetest": None}


class SchedulerReplaced(Rule):
    """A DeepSpeed `scheduler` block under the HF Trainer replaces `--lr_scheduler_type`.

    What: with `scheduler` in the config, transformers hands DeepSpeed's scheduler to the engine
    (`deepspeed_optim_sched`: `DummyScheduler`) and never builds the one `--lr_scheduler_type` names.
    `WarmupLR` holds the peak LR flat after warm-up where the script asked for cosine or linear decay.

    Fix (unsafe: changes the LR curve to the one asked for): remove `scheduler` so the Trainer's scheduler runs,
    or pick the DeepSpeed type with the same shape (WarmupDecayLR = linear, WarmupCosineLR = cosine).
    """

    code = "DSC116"
    name = "trainer.scheduler-replaced"
    severity = Severity.WARNING
    summary = "a DeepSpeed scheduler block replaces --lr_scheduler_type under the HF Trainer"
    evidence = (HF_DS, "https://huggingface.co/docs/transformers/main/en/deepspeed")
    _warmup = {"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": "auto"}}}
    examples = (
        Example(_warmup, valid=False, args={**_HF, "lr_scheduler_type": "cosine"}, fixed={}),
        Example(_warmup, valid=False, args=_HF, note="the HF default is linear decay", fixed={}),
        Example(_warmup, valid=True, args={**_HF, "lr_scheduler_type": "constant_with_warmup"}),
        Example({"scheduler": {"type": "WarmupCosineLR"}}, valid=True, args={**_HF, "lr_scheduler_type": "cosine"}),
        Example({"scheduler": {"type": "WarmupLR"}, "train_micro_batch_size_per_gpu": 4}, valid=True,
                note="DeepSpeed's own loop: its scheduler is the one asked for"),
    )

    def check(self, ctx: LintContext) -> Iterable[Finding]:
        block = ctx.raw.get("scheduler")
        if not ctx.hf_trainer or not isinstance(block, dict):
            return
        kind = str(block.get("type", "?"))
        same = _SAME_SHAPE.get(kind.lower())
        fix = Fix("remove the scheduler block so --lr_scheduler_type applies", safe=False, edits=(delete("scheduler"),))
        if not ctx.hf_args:
            yield self.finding(ctx, f"the DeepSpeed scheduler block ({kind}) replaces --lr_scheduler_type under the HF "
                               "Trainer: the run follows it whatever the script asks", "scheduler.type", fix=fix,
                               severity=Severity.INFO)
            return
        asked = str(ctx.arg("lr_scheduler_type", "linear")).lower().removeprefix("schedulertype.")
        if asked == same:
            return
        shape = f" ({same.replace('_', ' ')})" if same else ""
        yield self.finding(ctx, f"the DeepSpeed scheduler block {kind}{shape} replaces --lr_scheduler_type {asked}: the "
                           "Trainer never builds the scheduler the script asks for", "scheduler.type", fix=fix)


_ONEBIT = {"onebitadam": "1bit-Adam", "zerooneadam": "0/1 Adam", "onebitlamb": "1bit-Lamb"}


class OneBitWithZero(Rule):
    """1-bit Adam, 0/1 Adam or 1-bit LAMB with ZeRO enabled (or on a DeepSpeed that removed them).

    What: `_configure_basic_optimizer` asserts `not self.zero_optimization()` for each of them (checked in
    0.12.6 and 0.19.6): any ZeRO stage >= 1 stops the run at start-up. DeepSpeed 0.19.7 removed the three
    optimizers: the engine then looks the type up in torch.optim and fails.

    Fix (manual): ZeRO stage 0 with these optimizers, or Adam/AdamW with ZeRO (or pin DeepSpeed < 0.19.7).
    """

    issues = ("deepspeed-removed-0197",)
    code = "DSC117"
    name = "optimizer.onebit-with-zero"
    severity = Severity.ERROR
    summary = "1-bit Adam / 0/1 Adam / 1-bit LAMB with ZeRO, or on DeepSpeed >= 0.19.7: DeepSpeed refuses to start"
    evidence = (f"{DS}/blob/v0.19.6/deepspeed/runtime/engine.py", f"{DS}/issues/8489")
    _adam = {"optimizer": {"type": "OneBitAdam", "params": {"lr": 1e-4, "freeze_step": 100}}}
    examples = (
        Example({**_adam, "zero_optimization": {"stage": 2}}, valid=False, env={"deepspeed": "0.12.6"}),
        Example({**_adam, "zero_optimization": {"stage": 0}}, valid=False, env={"deepspeed": "0.19.8"},
                note="removed in 0.19.7"),
        Example({**_adam, "zero_optimization": {"stage": 0}}, valid=True, env={"deepspeed": "0.12.6"}),
        Example({"optimizer": {"type": "AdamW"}, "zero_optimization": {"stage": 2}}, valid=True),
    )

    def check(self, ctx: LintContext) -> Iterable[Finding]:
        kind = str(ctx.written("optimizer.type", "")).lower()
        if kind not in _ONEBIT:
            return
        name = ctx.written("optimizer.type")
        if kd.REMOVED_0197.affects("deepspeed", ctx.version("deepspeed")):
            yield self.finding(ctx, f"DeepSpeed {ctx.version('deepspeed')} removed {name} (0.19.7): start-up fails with "
                               f"\"module 'torch.optim' has no attribute '{name}'\"", "optimizer.type",
                               fix=Fix("use Adam/AdamW, or pin DeepSpeed < 0.19.7", safe=False))
            return
        if ctx.zero_stage and ctx.zero_stage >= 1:
            yield self.finding(ctx, f"{name} with ZeRO-{ctx.zero_stage}: DeepSpeed refuses to start with "
                               f"\"{_ONEBIT[kind]} is not compatible with ZeRO\"", "optimizer.type",
                               fix=Fix("set zero_optimization.stage to 0, or use Adam/AdamW with ZeRO", safe=False))


class Zero3NoHfSave(Rule):
    """ZeRO-3 under the HF Trainer without `stage3_gather_16bit_weights_on_model_save`: no HF weights saved.

    What: `Trainer.save_model` under ZeRO-3 asks accelerate for the full state dict; without the flag that
    raises, the Trainer logs "stage3_gather_16bit_weights_on_model_save=false. Saving the full checkpoint
    instead, use zero_to_fp32.py to recover weights", deletes the empty weights file and writes only a
    DeepSpeed checkpoint: `from_pretrained(output_dir)` then finds no model.

    Fix (manual; the save gathers the whole 16-bit model): `"stage3_gather_16bit_weights_on_model_save": true`,
    or run zero_to_fp32.py after training.
    """

    code = "DSC118"
    name = "zero3.no-16bit-save"
    severity = Severity.WARNING
    summary = "ZeRO-3 under the HF Trainer without stage3_gather_16bit_weights_on_model_save: no HF weights saved"
    evidence = ("https://github.com/huggingface/transformers/blob/main/src/transformers/trainer.py",
                "https://huggingface.co/docs/transformers/main/en/deepspeed#save-model-weights")
    _z3 = {"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": "auto"}
    examples = (
        Example(_z3, valid=False),
        Example({"zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": "auto"}},
                valid=False, args=_HF, note='"auto": info, false unless accelerate says true'),
        Example({"zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": "auto"}},
                valid=True, args={**_HF, "zero3_save_16bit_model": True}, note="accelerate YAML sets it"),
        Example({"zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": True}}, valid=True,
                args=_HF),
        Example({"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 4}, valid=True,
                note="DeepSpeed's own loop saves DeepSpeed checkpoints anyway"),
    )

    def check(self, ctx: LintContext) -> Iterable[Finding]:
        if not ctx.hf_trainer or ctx.zero_stage != 3:
            return
        zero = ctx.section("zero_optimization")
        flag = zero.get("stage3_gather_16bit_weights_on_model_save", zero.get("stage3_gather_fp16_weights_on_model_save"))
        if as_bool(flag) is True or (flag == "auto" and ctx.arg("zero3_save_16bit_model") is True):
            return
        # manual: the key changes only what is saved, never the run (a probe arm or an unsafe fix would be noise)
        fix = Fix("set zero_optimization.stage3_gather_16bit_weights_on_model_save to true (gathers the 16-bit model "
                  "at save), or run zero_to_fp32.py after training", safe=False)
        path = "zero_optimization.stage3_gather_16bit_weights_on_model_save"
        if flag == "auto":  # accelerate fills it from zero3_save_16bit_model (false unless its config says true)
            yield self.finding(ctx, 'ZeRO-3 with stage3_gather_16bit_weights_on_model_save "auto": accelerate fills it '
                               "from zero3_save_16bit_model, false unless the accelerate config sets it; then "
                               "trainer.save_model() writes no HF weights", path, fix=fix, severity=Severity.INFO)
            return
        yield self.finding(ctx, "ZeRO-3 without stage3_gather_16bit_weights_on_model_save: trainer.save_model() writes "
                           "no HF weights, only a DeepSpeed checkpoint (zero_to_fp32.py needed to load the model)",
                           path, fix=fix)


# key path -> (the known issue whose release removed it, what replaces it)
_REMOVED = {
    ("nebula",): (kd.REMOVED_0197, "checkpoints would silently fall back to torch.save"),
    ("compression_training",): (kd.REMOVED_0197, "the model would train unquantized"),
    ("quantize_training",): (kd.REMOVED_0197, "MoQ is gone"),
    ("sparse_attention",): (kd.REMOVED_0197, "use the model's own attention"),
    ("zero_optimization", "mics_shard_size"): (kd.REMOVED_0197, "use plain ZeRO-3 or hpZ (zero_hpz_partition_size)"),
    ("zero_optimization", "mics_hierarchical_params_gather"): (kd.REMOVED_0197, "use plain ZeRO-3"),
    ("amp",): (kd.REMOVED_0198, "use fp16, bf16 or torch_autocast"),
    ("sparse_gradients",): (kd.REMOVED_0198, "embeddings built with sparse=True need no flag"),
    ("eigenvalue",): (kd.REMOVED_0198, "MoQ is gone"),
    ("elasticity",): (kd.REMOVED_0198, "set the batch keys directly"),
    ("graph_harvesting",): (kd.REMOVED_0198, "remove it"),
    ("curriculum_learning",): (kd.REMOVED_0198, "use data_efficiency.data_sampling.curriculum_learning"),
    ("progressive_layer_drop",): (kd.REMOVED_0198, "remove it"),
    ("zero_optimization", "zeropp_loco_param"): (kd.REMOVED_0198, "plain ZeRO++ quantized gradients"),
}


class RemovedFeature(Rule):
    """A config key for a feature the DeepSpeed release removed: it refuses to start.

    What: DeepSpeed 0.19.7 and 0.19.8 removed Nebula, the compression library, MoQ, sparse attention, MiCS,
    Apex AMP, sparse embedding gradients, elasticity, graph harvesting, legacy top-level curriculum learning,
    progressive layer drop and LoCo-ZeRO++ (issue #8489). Their config keys now raise DeepSpeedConfigError at
    start-up (before, a leftover block was honoured). Older releases are judged by the assumed version; on a
    release that still has the feature lint says at info level which releases refuse the config.

    Fix (manual): remove the key (curriculum learning moves under data_efficiency), or pin the older DeepSpeed.
    """

    issues = ("deepspeed-removed-0197", "deepspeed-removed-0198")
    code = "DSC004"
    name = "config.removed-feature"
    severity = Severity.ERROR
    summary = "a key for a feature the DeepSpeed release removed (MiCS, sparse attention, amp, ...): no start-up"
    evidence = (f"{DS}/issues/8489",)
    examples = (
        Example({"amp": {"enabled": True}}, valid=False, env={"deepspeed": "0.19.8"}),
        Example({"zero_optimization": {"stage": 3, "mics_shard_size": 8}}, valid=False, env={"deepspeed": "0.19.7"}),
        Example({"curriculum_learning": {"enabled": True}}, valid=False, note="version unknown: a warning"),
        Example({"amp": {"enabled": True}}, valid=True, env={"deepspeed": "0.19.7"}),
        Example({"sparse_attention": {"mode": "fixed"}}, valid=True, env={"deepspeed": "0.14.0"}),
    )

    def check(self, ctx: LintContext) -> Iterable[Finding]:
        version = ctx.version("deepspeed")
        for path, (issue, instead) in _REMOVED.items():
            if not ctx.has(path):
                continue
            removed = issue.affects("deepspeed", version)
            if removed is False:
                continue
            since = issue.windows[0].low
            key = ".".join(path)
            fix = Fix(f"remove {key} ({instead}), or pin DeepSpeed < {since}", safe=False)
            if removed is None:
                yield self.finding(ctx, f"{key}: removed in DeepSpeed {since}, which refuses a config that has it; "
                                   "the DeepSpeed version is unknown here (pass --env)", key, fix=fix,
                                   severity=Severity.WARNING)
                continue
            yield self.finding(ctx, f"{key}: DeepSpeed {version} removed this feature ({since}) and refuses to start "
                               "with DeepSpeedConfigError", key, fix=fix)
