"""Version risks from the installed packages or a pasted `pip freeze` (the known issues' version windows)."""

from __future__ import annotations

from collections.abc import Iterable

from lossguard.core.findings import Finding, Severity
from lossguard.knowledge import deepspeed as kd
from lossguard.knowledge import training as kt
from lossguard.lint.context import LintContext, as_number
from lossguard.lint.rules.base import Example, Fix, Rule


class TorchCudnnSdpa(Rule):
    """torch with the cuDNN SDPA attention backend on by default.

    What: torch 2.5.0 made cuDNN SDPA the default on H100 and it produced NaN gradients from the first
    backward (pytorch #138649, #139298; made opt-in again in 2.5.1). 2.9 re-enabled it on SM90/SM100
    and new shape-dependent NaN bugs followed (#196678, trl #7181).

    Fix (manual): avoid torch 2.5.0; on torch >= 2.9 with H100/H200/B200 call
    `torch.backends.cuda.enable_cudnn_sdp(False)` if NaN appears, or switch attn_implementation.
    """

    issues = (kt.ATTENTION_KERNEL_NAN.id,)
    engines = ("deepspeed", "fsdp")  # not tied to the engine
    code = "ENV301"
    name = "torch.cudnn-sdpa"
    severity = Severity.WARNING
    summary = "torch 2.5.0 (or >= 2.9 on Hopper) cuDNN SDPA: NaN gradients"
    signature = "nonfinite"
    evidence = ("https://github.com/pytorch/pytorch/issues/138649", "https://github.com/pytorch/pytorch/issues/139298",
                "https://github.com/pytorch/pytorch/issues/196678")
    examples = (
        Example({}, valid=False, env={"torch": "2.5.0"}),
        Example({}, valid=False, env={"torch": "2.13.0+cu128"}, note="info on >= 2.9"),
        Example({}, valid=True, env={"torch": "2.5.1"}),
        Example({}, valid=True, env={"torch": "2.13.0+cpu"}, note="a CPU build has no cuDNN"),
        Example({}, valid=True),
    )

    def check(self, ctx: LintContext) -> Iterable[Finding]:
        version = ctx.version("torch")
        fix = Fix("avoid torch 2.5.0, or torch.backends.cuda.enable_cudnn_sdp(False)", safe=True)
        default_on, reenabled = kt.ATTENTION_KERNEL_NAN.windows
        if default_on.contains(version):
            yield self.finding(ctx, f"torch {version} enables cuDNN SDPA by default on H100: NaN gradients from the first "
                               "step (pytorch #138649)", "env.torch", fix=fix)
        elif reenabled.contains(version) and not str(version).endswith("+cpu"):  # a CPU build has no cuDNN
            yield self.finding(ctx, f"torch {version} uses cuDNN SDPA by default on SM90/SM100 (H100/H200/B200), with "
                               "shape-dependent NaN gradient bugs; disable it if NaN appears", "env.torch", fix=fix,
                               severity=Severity.INFO)


class TransformersGaLossBug(Rule):
    """transformers 4.46.0 - 4.48.x with gradient accumulation: wrong loss scale.

    What: the gradient-accumulation loss fixes of 4.46 introduced regressions: losses "5x to 10x"
    higher (#34263), "very large" with models taking loss_kwargs in 4.48.0 (#35663, fixed by #35651).
    Not a dead run, but thresholds and comparisons break. The bug is in the HF Trainer's loss: only
    configs the Trainer runs are affected (arguments only it takes, a framework built on it, or "auto"
    values); Megatron and pipeline configs are not. With GA unknown ("auto", no arguments) it is an info.

    Fix (manual): upgrade transformers to >= 4.49.
    """

    issues = (kt.GA_LOSS_SCALE.id,)
    engines = ("deepspeed", "fsdp")  # not tied to the engine
    code = "ENV302"
    name = "transformers.ga-loss-bug"
    severity = Severity.WARNING
    summary = "transformers 4.46.0 - 4.48.x gradient-accumulation loss scaling bugs"
    evidence = kt.GA_LOSS_SCALE.sources
    examples = (
        Example({"gradient_accumulation_steps": 8}, valid=False, env={"transformers": "4.46.1"},
                args={"per_device_train_batch_size": 4}),
        Example({"gradient_accumulation_steps": 1}, valid=True, env={"transformers": "4.46.1"}),
        Example({"gradient_accumulation_steps": 8}, valid=True, env={"transformers": "4.49.0"}),
        Example({"gradient_accumulation_steps": 8}, valid=True, env={"transformers": "4.47.0"},
                args={"micro-batch-size": 1, "pipeline-model-parallel-size": 2}, note="Megatron: no HF Trainer"),
        Example({"gradient_accumulation_steps": 8, "train_micro_batch_size_per_gpu": 4}, valid=True,
                env={"transformers": "4.47.0"}, note="no arguments, no \"auto\": nothing says the Trainer runs it"),
        Example({"gradient_accumulation_steps": 8, "train_micro_batch_size_per_gpu": "auto"}, valid=False,
                env={"transformers": "4.47.0"}),
    )

    def check(self, ctx: LintContext) -> Iterable[Finding]:
        if not ctx.hf_trainer or not kt.GA_LOSS_SCALE.affects("transformers", ctx.version("transformers")):
            return
        ga = as_number(ctx.config.get("gradient_accumulation_steps"))
        if ga is None:
            ga = as_number(ctx.arg("gradient_accumulation_steps"))
        if ga is not None and ga <= 1:
            return
        fix = Fix(kt.GA_LOSS_SCALE.fix, safe=True)
        if ga is None:
            yield self.finding(ctx, f"transformers {ctx.version('transformers')}: if the run accumulates gradients "
                               "(gradient_accumulation_steps is not known here), the Trainer reports wrongly scaled "
                               "losses (#34263, #35663)", "env.transformers", fix=fix, severity=Severity.INFO)
            return
        yield self.finding(ctx, f"transformers {ctx.version('transformers')} with gradient accumulation ({ga:g}) reports "
                           "wrongly scaled losses (#34263, #35663)", "env.transformers", fix=fix)


class DeepSpeedBf16Unclipped(Rule):
    """DeepSpeed 0.9.2 - 0.9.5, bf16 ZeRO-1/2: no gradient clipping, grad_norm logged as 0.

    What: PR #3166 skipped the norm computation and clipping for non-fp16; reverted by PR #3790 in
    0.10.0. Old LLaVA (`deepspeed==0.9.5`) falls here: bf16 runs were unclipped.

    Fix (manual): upgrade DeepSpeed.
    """

    issues = (kd.BF16_UNCLIPPED.id,)
    code = "ENV303"
    name = "deepspeed.bf16-unclipped"
    severity = Severity.WARNING
    summary = "DeepSpeed 0.9.2 - 0.9.5 bf16 ZeRO-1/2 does not clip gradients"
    evidence = kd.BF16_UNCLIPPED.sources
    examples = (
        Example({"bf16": {"enabled": True}, "zero_optimization": {"stage": 2}}, valid=False, env={"deepspeed": "0.9.5"}),
        Example({"bf16": {"enabled": True}, "zero_optimization": {"stage": 2}}, valid=True, env={"deepspeed": "0.10.0"}),
    )

    def check(self, ctx: LintContext) -> Iterable[Finding]:
        if ctx.bf16 and ctx.zero_stage in (1, 2) and kd.BF16_UNCLIPPED.affects("deepspeed", ctx.version("deepspeed")):
            yield self.finding(ctx, f"DeepSpeed {ctx.version('deepspeed')} bf16 ZeRO-{ctx.zero_stage} neither computes "
                               "the gradient norm nor clips (PR #3166); grad_norm logs 0.0", "env.deepspeed",
                               fix=Fix(kd.BF16_UNCLIPPED.fix, safe=True))


class DeepSpeedZero3StreamRace(Rule):
    """DeepSpeed < 0.18.8 ZeRO-3 bf16 with torch >= 2.10: NaN weight partitions.

    What: the ZeRO-3 reduce stream waited on the default stream rather than the current one; with
    torch >= 2.10 bf16 partitions turned NaN. Fixed by PR #7898 in 0.18.8.

    Fix (manual): upgrade DeepSpeed to >= 0.18.8.
    """

    issues = (kd.ZERO3_STREAM_RACE.id,)
    code = "ENV304"
    name = "deepspeed.zero3-stream-race"
    severity = Severity.WARNING
    summary = "DeepSpeed < 0.18.8 ZeRO-3 bf16 with torch >= 2.10: NaN partitions"
    signature = "nonfinite"
    evidence = kd.ZERO3_STREAM_RACE.sources
    _cfg = {"bf16": {"enabled": True}, "zero_optimization": {"stage": 3}}
    examples = (
        Example(_cfg, valid=False, env={"deepspeed": "0.18.2", "torch": "2.10.0"}),
        Example(_cfg, valid=True, env={"deepspeed": "0.18.8", "torch": "2.10.0"}),
        Example(_cfg, valid=True, env={"deepspeed": "0.18.2", "torch": "2.9.1"}),
    )

    def check(self, ctx: LintContext) -> Iterable[Finding]:
        if not (ctx.bf16 and ctx.zero_stage == 3):
            return
        issue = kd.ZERO3_STREAM_RACE
        if issue.affects("deepspeed", ctx.version("deepspeed")) and issue.affects("torch", ctx.version("torch")):
            yield self.finding(ctx, f"DeepSpeed {ctx.version('deepspeed')} ZeRO-3 bf16 with torch {ctx.version('torch')}: "
                               "the reduce stream race turns weight partitions NaN (PR #7898)", "env.deepspeed",
                               fix=Fix(issue.fix, safe=True))
