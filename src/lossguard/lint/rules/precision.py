"""Mixed-precision risks: bf16 without overflow skip, fp16 misuse (known issues bf16-no-overflow-check, fp16-activation-overflow)."""

from __future__ import annotations

import re
from collections.abc import Iterable

from lossguard.core.findings import Finding, Severity
from lossguard.lint.context import LintContext, as_bool, as_number
from lossguard.lint.rules.base import Example, Fix, Rule, set_

DS = "https://github.com/deepspeedai/DeepSpeed"


def bf16_optimizer_path(ctx: LintContext) -> bool:
    """ZeRO-1 + bf16 + fp32 gradient accumulation without CPU offload: the engine builds BF16_Optimizer, not
    the ZeRO optimizer (engine._do_optimizer_sanity_check); check_grad_overflow does not reach it, and it
    skips a step whose global gradient norm is not finite (bf16_optimizer.py step(), checked on 0.19.8)."""
    accum = str(ctx.written("data_types.grad_accum_dtype", "")).lower()
    offload = str(ctx.written("zero_optimization.offload_optimizer.device", "none")).lower()
    return (ctx.zero_stage == 1 and bool(ctx.bf16) and accum in ("fp32", "float32", "float")
            and offload != "cpu")


def _overflow_check(ctx: LintContext) -> tuple[bool | None, str]:
    """(does bf16 ZeRO-1/2 skip non-finite steps?, why) at this DeepSpeed version."""
    path = ctx.bf16_section_path()
    explicit = as_bool(ctx.written((*path, "check_grad_overflow")))
    if not ctx.version_known("deepspeed"):
        return explicit, "check_grad_overflow " + ("is set" if explicit is not None else "is unset and its default "
                                                   "depends on the DeepSpeed version (off 0.11.2-0.19.2)")
    if ctx.in_range("deepspeed", None, "0.11.2"):
        return True, "this version checks bf16 overflow"
    if ctx.in_range("deepspeed", "0.11.2", "0.17.1"):
        return False, f"DeepSpeed {ctx.version('deepspeed')} never checks bf16 overflow (PR #4512; option added in 0.17.1)"
    if ctx.in_range("deepspeed", "0.17.1", "0.19.3"):
        on = explicit is True
        return on, f"DeepSpeed {ctx.version('deepspeed')} checks bf16 overflow only when check_grad_overflow is true (opt-in)"
    return explicit is not False, f"DeepSpeed {ctx.version('deepspeed')} checks unless check_grad_overflow is false"


class Bf16OverflowCheck(Rule):
    """bf16 ZeRO-1/2 that does not skip steps with non-finite gradients.

    What: since DeepSpeed 0.11.2 (PR #4512) ZeRO calls check_overflow() only for fp16. One inf in a
    bf16 gradient goes into Adam, `inf/sqrt(inf) = NaN` lands in the moments and master weights, and
    every later step is NaN (logged as loss 0.0). 0.17.1 (PR #6976) added the opt-in
    `"bf16": {"check_grad_overflow": true}`; 0.19.3 (PR #8035) made it the default.

    Why it matters: this is the amplifier that turns one transient NaN (a comm race, a bad sample, a
    kernel bug) into a dead run.

    Fix (safe, 0.17.1 and later or version unknown): `"bf16": {"enabled": ..., "check_grad_overflow": true}`.
    On 0.11.2-0.17.0 the option does not exist: upgrade DeepSpeed. Skips are silent in bf16 (#8415):
    see DSC110.
    """

    issues = ("bf16-no-overflow-check",)
    code = "DSC105"
    name = "precision.bf16-overflow-check"
    severity = Severity.WARNING
    summary = "bf16 ZeRO-1/2 without check_grad_overflow: one NaN gradient kills the weights"
    signature = "nonfinite-hidden"
    evidence = (f"{DS}/pull/4512", f"{DS}/pull/6976", f"{DS}/pull/8035", f"{DS}/issues/8415")
    _bad = {"bf16": {"enabled": True}, "zero_optimization": {"stage": 2}}
    _fixed = {"bf16": {"enabled": True, "check_grad_overflow": True}, "zero_optimization": {"stage": 2}}
    examples = (
        Example(_bad, valid=False, env={"deepspeed": "0.18.0"}, fixed=_fixed),
        Example(_bad, valid=False, fixed=_fixed, note="version unknown"),
        Example(_bad, valid=False, env={"deepspeed": "0.14.0"}, note="option absent: upgrade"),
        Example({"bf16": {"enabled": True, "check_grad_overflow": False}, "zero_optimization": {"stage": 2}},
                valid=False, env={"deepspeed": "0.19.8"}, fixed=_fixed),
        Example(_bad, valid=True, env={"deepspeed": "0.19.3"}),
        Example(_bad, valid=True, env={"deepspeed": "0.10.3"}),
        Example(_fixed, valid=True, env={"deepspeed": "0.18.0"}),
        Example({"bf16": {"enabled": True}, "zero_optimization": {"stage": 3}}, valid=True, env={"deepspeed": "0.18.0"}),
    )

    def check(self, ctx: LintContext) -> Iterable[Finding]:
        if ctx.bf16 is False or ctx.zero_stage not in (1, 2):
            return
        if bf16_optimizer_path(ctx):
            yield from self._bf16_optimizer(ctx)
            return
        checks, why = _overflow_check(ctx)
        if checks:
            return
        path = ctx.bf16_section_path()
        bf16 = "bf16" if ctx.bf16 else "bf16 (\"auto\", if enabled)"
        msg = f"{bf16} ZeRO-{ctx.zero_stage} does not skip steps with NaN/Inf gradients: {why}; one bad step makes the weights NaN"
        if ctx.in_range("deepspeed", "0.11.2", "0.17.1"):
            yield self.finding(ctx, msg, ".".join(path),
                               fix=Fix("upgrade DeepSpeed to >= 0.17.1 and set bf16.check_grad_overflow: true", safe=False))
            return
        edits = [set_(".".join((*path, "check_grad_overflow")), True)]
        if not isinstance(ctx.raw.get(path[0]), dict):
            edits = [set_(path[0], {"enabled": "auto" if ctx.hf_args else True, "check_grad_overflow": True})]
        fix = Fix(f"set {path[0]}.check_grad_overflow to true (skips the step instead of applying NaN)", safe=True,
                  edits=tuple(edits))
        yield self.finding(ctx, msg, ".".join((*path, "check_grad_overflow")), fix=fix)


    def _bf16_optimizer(self, ctx: LintContext) -> Iterable[Finding]:
        """check_grad_overflow would be inert here: no config fix. 0.19.x skips non-finite steps on this path;
        older releases were not checked, so the finding names the upgrade, not a key."""
        if ctx.in_range("deepspeed", "0.19.0"):
            return
        yield self.finding(ctx, f"bf16 ZeRO-1 with fp32 gradient accumulation runs DeepSpeed's BF16_Optimizer, which "
                           f"bf16.check_grad_overflow does not reach; whether DeepSpeed {ctx.version('deepspeed') or '(version unknown)'} skips "
                           "a step with NaN/Inf gradients on this path is not confirmed", "data_types.grad_accum_dtype",
                           fix=Fix("upgrade DeepSpeed to >= 0.19 (its BF16_Optimizer skips non-finite steps)",
                                   safe=False), severity=Severity.INFO)


class Zero3Bf16NoOverflowCheck(Rule):
    """bf16 ZeRO-3: no DeepSpeed release skips non-finite steps.

    What: `stage3.py` still calls check_overflow() only for fp16, and `check_grad_overflow` applies to
    ZeRO-1/2 only. A single NaN gradient becomes NaN weights silently.

    Fix: none in the config; run with a live monitor (LossguardCallback) that stops on the first
    non-finite loss or grad_norm, and keep checkpoints.
    """

    code = "DSC106"
    name = "precision.zero3-bf16-no-overflow-check"
    severity = Severity.INFO
    summary = "bf16 ZeRO-3 never skips NaN/Inf steps; monitor the run"
    signature = "nonfinite-hidden"
    evidence = (f"{DS}/pull/4512", f"{DS}/pull/8035")
    examples = (
        Example({"bf16": {"enabled": True}, "zero_optimization": {"stage": 3}}, valid=False),
        Example({"bf16": {"enabled": True}, "zero_optimization": {"stage": 2}}, valid=True),
        Example({"fp16": {"enabled": True}, "zero_optimization": {"stage": 3}}, valid=True),
    )

    def check(self, ctx: LintContext) -> Iterable[Finding]:
        if ctx.bf16 and ctx.zero_stage == 3:
            yield self.finding(ctx, "bf16 ZeRO-3 has no overflow skip in any DeepSpeed release: a NaN gradient is "
                               "applied; watch the run with a monitor that stops on the first non-finite value",
                               "zero_optimization.stage")


class Fp16AndBf16(Rule):
    """Both fp16 and bf16 enabled.

    What: DeepSpeed refuses to start ("bfloat16 and fp16 modes cannot be simultaneously enabled");
    under the HF Trainer the two flags usually come from a copied launch script.

    Fix (unsafe: picks the precision): keep bf16 on bf16-capable GPUs (A100/H100), fp16 elsewhere.
    """

    code = "DSC107"
    name = "precision.fp16-and-bf16"
    severity = Severity.ERROR
    summary = "fp16 and bf16 both enabled"
    evidence = ("https://www.deepspeed.ai/docs/config-json/#bfloat16-training-options",)
    examples = (
        Example({"fp16": {"enabled": True}, "bf16": {"enabled": True}}, valid=False,
                fixed={"fp16": {"enabled": False}, "bf16": {"enabled": True}}),
        Example({"fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"}}, valid=True, args={"bf16": True}),
        Example({"fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"}}, valid=False,
                args={"bf16": True, "fp16": True}, note="both from the arguments: manual fix"),
    )

    def check(self, ctx: LintContext) -> Iterable[Finding]:
        if not (ctx.fp16 and ctx.bf16):
            return
        edits = () if ctx.written("fp16.enabled") == "auto" or not ctx.has("fp16") else (set_("fp16.enabled", False),)
        fix = Fix("disable fp16 and keep bf16" + ("" if edits else " (pass --fp16 False)"), safe=False, edits=edits)
        yield self.finding(ctx, "fp16 and bf16 are both enabled; DeepSpeed refuses to start", "fp16.enabled", fix=fix)


class Fp16NoClipping(Rule):
    """fp16 without gradient clipping.

    What: with fp16 and no `gradient_clipping` (absent or 0), a loss-scale spike or a bad batch goes
    straight into the optimizer. The HF Trainer does not clip under DeepSpeed itself: it relies on the
    config, and only fills `gradient_clipping: "auto"` from max_grad_norm when the key is present. An absent
    key means 0 up to DeepSpeed 0.19.2; 0.19.3 made the default 1.0 (an explicit 0 still turns clipping off).

    Fix (unsafe: changes the update): `"gradient_clipping": 1.0` (or "auto" under the HF Trainer).
    """

    code = "DSC108"
    name = "precision.fp16-no-clipping"
    severity = Severity.WARNING
    summary = "fp16 without gradient_clipping"
    signature = "fp16-overflow"
    evidence = ("https://github.com/huggingface/transformers/blob/main/src/transformers/integrations/deepspeed.py",)
    examples = (
        Example({"fp16": {"enabled": True}}, valid=False, fixed={"fp16": {"enabled": True}, "gradient_clipping": 1.0}),
        Example({"fp16": {"enabled": True}, "gradient_clipping": 1.0}, valid=True),
        Example({"fp16": {"enabled": True}, "gradient_clipping": "auto"}, valid=True, args={"fp16": True}),
        Example({"bf16": {"enabled": True}}, valid=True),
        Example({"fp16": {"enabled": True}}, valid=True, env={"deepspeed": "0.19.3"}, note="default 1.0 from 0.19.3"),
        Example({"fp16": {"enabled": True}, "gradient_clipping": 0}, valid=False, env={"deepspeed": "0.19.8"},
                fixed={"fp16": {"enabled": True}, "gradient_clipping": 1.0}),
    )

    issues = ("hf-clipping-dropped",)  # its window is the releases whose default is 0

    def check(self, ctx: LintContext) -> Iterable[Finding]:
        if not ctx.fp16:
            return
        if "gradient_clipping" not in ctx.raw and ctx.in_range("deepspeed", "0.19.3"):
            return  # DeepSpeed's own default clips at 1.0
        clip = ctx.config.get("gradient_clipping")
        if clip == "auto" or (as_number(clip) or 0) > 0:
            return
        fix = Fix("set gradient_clipping to 1.0", safe=False, edits=(set_("gradient_clipping", 1.0),))
        yield self.finding(ctx, f"fp16 training with gradient_clipping {clip!r}: nothing bounds an fp16 gradient "
                           "spike", "gradient_clipping", fix=fix)


# Model families released in bf16 whose activations overflow fp16 (GLM-4 #96/#234, Qwen-VL #352, ...).
BF16_FAMILIES = re.compile(r"qwen|glm|gemma|internlm|internvl|llama-?3|mistral|mixtral|deepseek|phi-?3|yi-|"
                           r"minicpm|baichuan2", re.IGNORECASE)


class Fp16OnBf16Model(Rule):
    """fp16 training of a model family pre-trained in bf16 (Qwen, GLM, Gemma, InternLM, Llama-3, ...).

    What: activations of these models exceed fp16's 65504; the forward or backward hits inf, then NaN.
    With DeepSpeed fp16 the loss scale halves until "Current loss scale already at minimum", the LR
    freezes and the log shows loss 0.0 (GLM-4 maintainers: bf16 is mandatory, #96, #234; Qwen-VL #352,
    LLaMA-Factory #4202).

    Fix (unsafe: needs a bf16-capable GPU, Ampere or newer): bf16 instead of fp16; on V100/T4 use fp32.
    """

    code = "DSC109"
    name = "precision.fp16-on-bf16-model"
    severity = Severity.ERROR
    summary = "fp16 on a model family pre-trained in bf16"
    signature = "fp16-overflow"
    evidence = ("https://github.com/zai-org/GLM-4/issues/96", "https://github.com/QwenLM/Qwen-VL/issues/352",
                "https://github.com/hiyouga/LlamaFactory/issues/4202")
    examples = (
        Example({"fp16": {"enabled": True}, "bf16": {"enabled": False}}, valid=False,
                args={"model_name_or_path": "THUDM/glm-4-9b-chat"},
                fixed={"fp16": {"enabled": False}, "bf16": {"enabled": True}}),
        Example({"fp16": {"enabled": "auto"}}, valid=False, args={"model_name_or_path": "Qwen/Qwen-VL-Chat", "fp16": True},
                note="fp16 from the arguments: manual fix"),
        Example({"fp16": {"enabled": True}}, valid=True, args={"model_name_or_path": "lmsys/vicuna-7b-v1.5"}),
        Example({"bf16": {"enabled": True}}, valid=True, args={"model_name_or_path": "Qwen/Qwen2-7B"}),
    )

    def check(self, ctx: LintContext) -> Iterable[Finding]:
        model = ctx.arg("model_name_or_path")
        if not ctx.fp16 or not isinstance(model, str):
            return
        match = BF16_FAMILIES.search(model)
        if not match:
            return
        edits: tuple = ()
        if ctx.written("fp16.enabled") not in (None, "auto") and ctx.written("bf16.enabled") != "auto":
            edits = (set_("fp16.enabled", False), set_("bf16.enabled", True))
        fix = Fix("train in bf16 (Ampere or newer GPU)" + ("" if edits else ": pass --bf16 True --fp16 False"),
                  safe=False, edits=edits)
        yield self.finding(ctx, f"fp16 is on for {model!r}, a {match.group(0)} model pre-trained in bf16: activations "
                           "overflow fp16 (65504), the loss scale collapses and the loss logs as 0.0", "fp16.enabled", fix=fix)


class Bf16SkipsInvisible(Rule):
    """bf16 with overflow skipping but no `steps_per_print`: skipped steps are invisible.

    What: in bf16 DeepSpeed skips a non-finite step silently (#8415): only the fp16 loss scaler prints
    OVERFLOW. The engine's `step=..., skipped=..., lr=...` progress line is the only place the count
    shows, and it is printed only when `steps_per_print` is set (default None in current releases).

    Fix (safe: logging only): `"steps_per_print": 10` (or any positive value).
    """

    code = "DSC110"
    name = "logging.bf16-skips-invisible"
    severity = Severity.INFO
    summary = "bf16 overflow skips are silent without steps_per_print"
    evidence = (f"{DS}/issues/8415",)
    _cfg = {"bf16": {"enabled": True, "check_grad_overflow": True}, "zero_optimization": {"stage": 2}}
    examples = (
        Example(_cfg, valid=False, env={"deepspeed": "0.19.3"}, fixed={**_cfg, "steps_per_print": 10}),
        Example({**_cfg, "steps_per_print": 50}, valid=True, env={"deepspeed": "0.19.3"}),
        Example(_cfg, valid=True, env={"deepspeed": "0.14.0"}, note="no skipping to see"),
    )

    def check(self, ctx: LintContext) -> Iterable[Finding]:
        if not ctx.bf16 or ctx.zero_stage not in (1, 2) or not _overflow_check(ctx)[0]:
            return
        if ctx.via_accelerate:  # accelerate's DeepSpeedPlugin sets steps_per_print to infinity: the key is inert
            yield self.finding(ctx, "bf16 steps with NaN/Inf gradients are skipped silently, and under the HF Trainer / "
                               "accelerate steps_per_print is overwritten with infinity, so no log line shows the "
                               "skipped count", "steps_per_print",
                               fix=Fix("watch the run with LossguardCallback (it counts skipped steps); "
                                       "steps_per_print has no effect on this route", safe=True))
            return
        spp = as_number(ctx.config.get("steps_per_print"))
        if spp is not None and spp > 0:
            return
        fix = Fix("set steps_per_print to 10 so DeepSpeed prints the skipped-step count", safe=True,
                  edits=(set_("steps_per_print", 10),))
        yield self.finding(ctx, "bf16 steps with NaN/Inf gradients are skipped silently and steps_per_print is unset, "
                           "so no log line shows the skipped count", "steps_per_print", fix=fix)
