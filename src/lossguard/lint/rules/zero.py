"""ZeRO-1/2 gradient-reduction risks (known issues zero12-*: the races, their DeepSpeed windows and fixes)."""

from __future__ import annotations

from collections.abc import Iterable

from lossguard.core.findings import Finding, Severity
from lossguard.knowledge import deepspeed as kd
from lossguard.lint.context import LintContext, as_bool, as_number
from lossguard.lint.rules.base import Example, Fix, Rule, delete, set_

DS = "https://github.com/deepspeedai/DeepSpeed"

ZERO2_OVERLAP = {"zero_optimization": {"stage": 2, "overlap_comm": True, "contiguous_gradients": True}}
ZERO2_SAFE = {"zero_optimization": {"stage": 2, "overlap_comm": False, "contiguous_gradients": True}}


# The overlap races in the order a version is checked (first hit wins), with the severity lint gives each
# and how the message names it. The windows come from the known-issues table (lossguard.knowledge).
_OVERLAP_RACES = (
    (kd.OVERLAP_RACE, Severity.ERROR, "the IPG double-buffer race (PR #2500, fixed in 0.14.3 by PR #5606)"),
    (kd.PINGPONG_RESET, Severity.ERROR, "the ping-pong buffer index reset that corrupts gradients (PR #6993, "
                                        "fixed by PR #7371 in 0.17.5)"),
    (kd.BUFFER_LIFETIME, Severity.WARNING, "the reduction-stream buffer lifetime race (fixed in 0.19.0 by PR #7965)"),
    (kd.COMPILE_STREAM_RACE, Severity.WARNING, "the multi-stream IPG race under torch.compile (fixed in 0.19.3 by "
                                               "PR #8080)"),
)


def overlap_risk(version: str | None, ctx: LintContext) -> tuple[Severity, str] | None:
    """(severity, why) for ZeRO-1/2 overlap_comm at this DeepSpeed version; None when no known race."""
    if not ctx.version_known("deepspeed"):
        return Severity.WARNING, ("DeepSpeed version unknown; every release before 0.19.3 has a ZeRO-1/2 overlap_comm "
                                  "race (fixes: PR #5606 in 0.14.3, #7805 in 0.18.5, #7965 in 0.19.0, #8080 in 0.19.3)")
    for issue, severity, why in _OVERLAP_RACES:
        if issue.affects("deepspeed", version):
            return severity, f"DeepSpeed {version} has {why}"
    return None


class OverlapComm(Rule):
    """ZeRO-1/2 with `overlap_comm: true` on a DeepSpeed release with a gradient-reduction race.

    What: ZeRO-1/2 overlaps the gradient reduce with backward compute through double-buffered IPG
    buckets. From 0.8.0 (PR #2500 removed a stream sync) until 0.14.3 (PR #5606), backward could
    overwrite a bucket still being reduced; 0.17.2-0.17.4 reset the ping-pong index (PR #6993 → #7371);
    buffers were recycled early until 0.19.0 (PR #7965) and torch.compile raced until 0.19.3 (PR #8080).

    Why it matters: corrupted averaged gradients become NaN, bf16 ZeRO applies them (no overflow skip),
    the weights die and the Trainer logs `loss: 0.0` forever. Only multi-GPU, only ZeRO-1/2; ZeRO-3 and
    `overlap_comm: false` make it go away. DeepSpeed's own default for stage 1/2 is false; the risky
    `true` comes from project-shipped JSONs (LLaVA, Qwen, GLM-4, InternLM-XComposer, old LLaMA-Factory).

    Fix (safe): `"overlap_comm": false`. It costs some step time and changes no math. Or upgrade
    DeepSpeed to >= 0.19.3.
    """

    issues = ("zero12-overlap-race", "zero12-pingpong-index-reset", "zero12-buffer-lifetime",
              "zero12-compile-stream-race")
    code = "DSC101"
    name = "zero.overlap-comm"
    severity = Severity.ERROR
    summary = "ZeRO-1/2 overlap_comm: true inside a DeepSpeed gradient-reduction race window"
    signature = "nonfinite-hidden"
    evidence = (f"{DS}/pull/5606", f"{DS}/issues/4298", f"{DS}/pull/7371", f"{DS}/pull/7965", f"{DS}/pull/8080",
                "https://github.com/haotian-liu/LLaVA/issues/1661")
    examples = (
        Example(ZERO2_OVERLAP, valid=False, env={"deepspeed": "0.12.6"}, fixed=ZERO2_SAFE, note="LLaVA's pin"),
        Example(ZERO2_OVERLAP, valid=False, env={"deepspeed": "0.17.3"}, fixed=ZERO2_SAFE),
        Example(ZERO2_OVERLAP, valid=False, fixed=ZERO2_SAFE, note="version unknown"),
        Example(ZERO2_OVERLAP, valid=True, env={"deepspeed": "0.19.3"}),
        Example(ZERO2_OVERLAP, valid=True, args={"world_size": 1}, env={"deepspeed": "0.12.6"}, note="one rank"),
        Example({"zero_optimization": {"stage": 3, "overlap_comm": True}}, valid=True, env={"deepspeed": "0.12.6"}),
        Example({"zero_optimization": {"stage": 2}}, valid=True, env={"deepspeed": "0.12.6"}, note="default is false"),
    )

    def check(self, ctx: LintContext) -> Iterable[Finding]:
        if ctx.zero_stage not in (1, 2) or ctx.overlap_comm is not True or not ctx.multi_rank:
            return
        risk = overlap_risk(ctx.version("deepspeed"), ctx)
        if risk is None:
            return
        severity, why = risk
        world = f" with {ctx.world_size} ranks" if ctx.world_size else ""
        fix = Fix("set zero_optimization.overlap_comm to false (slower, same math)", safe=True,
                  edits=(set_("zero_optimization.overlap_comm", False),))
        yield self.finding(ctx, f"ZeRO-{ctx.zero_stage} overlap_comm is true{world}; {why}. Corrupted gradients turn "
                           "into NaN weights and a logged loss of 0.0", "zero_optimization.overlap_comm",
                           fix=fix, severity=severity)


class CommDtypeFp32(Rule):
    """`communication_data_type: fp32` in a bf16 run with overlapped ZeRO-1/2 on DeepSpeed < 0.19.

    What: with bf16 gradients, an explicit fp32 communication dtype makes every bucket an fp32 upcast
    copy: twice the bytes on the wire and extra work on the reduction stream, which is exactly the
    "communication slower than compute" condition in which the overlap races corrupt the IPG buffer
    (PR #5606). The QwenLM/Qwen #967 Qwen-7B run (loss → 0 within 10 steps) was reportedly fixed by
    removing it. Evidence level: inferred (a risk multiplier, not a bug by itself).

    Fix (unsafe: changes the reduction precision): drop `communication_data_type` so bf16 runs
    communicate in bf16 (DeepSpeed's default), or set `overlap_comm: false` (DSC101).
    """

    issues = ("zero12-fp32-communication",)
    code = "DSC102"
    name = "zero.comm-dtype-fp32"
    severity = Severity.WARNING
    summary = "communication_data_type fp32 with bf16 and overlapped ZeRO-1/2 (DeepSpeed < 0.19)"
    signature = "nonfinite-hidden"
    evidence = ("https://github.com/QwenLM/Qwen/issues/967", f"{DS}/pull/5606", f"{DS}/pull/7965")
    _bad = {"bf16": {"enabled": True}, "communication_data_type": "fp32", **ZERO2_OVERLAP}
    examples = (
        Example(_bad, valid=False, env={"deepspeed": "0.13.1"},
                fixed={"bf16": {"enabled": True}, **ZERO2_OVERLAP}),
        Example({**_bad, "zero_optimization": {"stage": 2, "overlap_comm": False}}, valid=True,
                env={"deepspeed": "0.13.1"}),
        Example(_bad, valid=True, env={"deepspeed": "0.19.0"}),
        Example({**_bad, "bf16": {"enabled": False}}, valid=True, env={"deepspeed": "0.13.1"}),
    )

    def check(self, ctx: LintContext) -> Iterable[Finding]:
        if ctx.comm_dtype != "fp32" or ctx.bf16 is False or ctx.zero_stage not in (1, 2) or not ctx.overlap_comm:
            return
        if kd.COMM_DTYPE_FP32.affects("deepspeed", ctx.version("deepspeed")) is False or not ctx.multi_rank:
            return
        bf16 = "bf16" if ctx.bf16 else "bf16 (if enabled)"
        fix = Fix("remove communication_data_type (bf16 runs then reduce in bf16)", safe=False,
                  edits=(delete("communication_data_type"),))
        yield self.finding(ctx, f"communication_data_type is {ctx.config.get('communication_data_type')!r} in a {bf16} "
                           f"run with ZeRO-{ctx.zero_stage} overlap_comm on DeepSpeed "
                           f"{ctx.version('deepspeed') or '(version unknown)'}: every bucket is upcast, widening the "
                           "overlap race window (Qwen #967)", "communication_data_type", fix=fix)


class AutoBucketOverlap(Rule):
    """`reduce_bucket_size: "auto"` together with ZeRO-1/2 `overlap_comm: true`.

    What: the HF integration turns "auto" into hidden_size² elements (16.8M for a 4096-wide 7B model),
    about 30× smaller than DeepSpeed's 5e8 default, so the double buffers are swapped ~30× more often
    and the overlap race (DSC101) has many more chances per step. LLaVA's `scripts/zero2.json` ships this.

    Fix (unsafe: bigger buckets use more GPU memory): an explicit `reduce_bucket_size` of 5e8, or
    `overlap_comm: false` (DSC101), or DeepSpeed >= 0.19.3.
    """

    issues = ("zero12-overlap-race", "zero12-compile-stream-race")
    root_cause = "DSC101"  # overlap_comm off removes the reason for bigger buckets
    code = "DSC103"
    name = "zero.auto-bucket-overlap"
    severity = Severity.WARNING
    summary = 'reduce_bucket_size "auto" (hidden²) with overlapped ZeRO-1/2'
    signature = "nonfinite-hidden"
    evidence = (f"{DS}/pull/5606", "https://github.com/haotian-liu/LLaVA/blob/main/scripts/zero2.json")
    _bad = {"zero_optimization": {"stage": 2, "overlap_comm": True, "reduce_bucket_size": "auto"}}
    examples = (
        Example(_bad, valid=False, env={"deepspeed": "0.12.6"}, args={"model_name_or_path": "lmsys/vicuna-7b-v1.5"},
                fixed={"zero_optimization": {"stage": 2, "overlap_comm": True, "reduce_bucket_size": 500000000}}),
        Example({"zero_optimization": {"stage": 2, "overlap_comm": True, "reduce_bucket_size": 5e8}}, valid=True,
                env={"deepspeed": "0.12.6"}),
        Example({"zero_optimization": {"stage": 2, "overlap_comm": False, "reduce_bucket_size": "auto"}}, valid=True),
    )

    def check(self, ctx: LintContext) -> Iterable[Finding]:
        if ctx.written("zero_optimization.reduce_bucket_size") != "auto":
            return
        if ctx.zero_stage not in (1, 2) or not ctx.overlap_comm or not ctx.multi_rank:
            return
        if kd.COMPILE_STREAM_RACE.affects("deepspeed", ctx.version("deepspeed")) is False:  # past the last race
            return
        resolved = ctx.resolution.filled.get(("zero_optimization", "reduce_bucket_size"))
        size = f" = {resolved[0]:,} elements from {resolved[1]}" if resolved else " (= hidden_size² under the HF Trainer)"
        fix = Fix("set reduce_bucket_size to 500000000 (DeepSpeed's default; more GPU memory)", safe=False,
                  edits=(set_("zero_optimization.reduce_bucket_size", 500000000),))
        yield self.finding(ctx, f'reduce_bucket_size is "auto"{size} with ZeRO-{ctx.zero_stage} overlap_comm: about '
                           "30x more bucket swaps than the 5e8 default, each one a chance for the overlap race",
                           "zero_optimization.reduce_bucket_size", fix=fix)


class MultiRankBucketAllreduce(Rule):
    """ZeRO-1/2 on DeepSpeed 0.12.4 - 0.14.x with `use_multi_rank_bucket_allreduce` left on.

    What: PR #4695 (0.12.4) replaced the per-rank reduce with a flatten → all_reduce → copy-back path
    on the reduction stream (default on). A user bisect (DeepSpeed #5242) found 0.12.4-0.12.6 give
    "grad_norm always 1.0, and loss 0" and 0.13.5 "grad_norm always nan"; #5347 the same on 0.14.0.
    Until 0.13.0 (PR #4946) ZeRO-2 ignored `use_multi_rank_bucket_allreduce: false`.

    Only with `overlap_comm: true`: serialising the reduction made it go away in every report.

    Fix: on 0.13.0-0.14.x set `"use_multi_rank_bucket_allreduce": false` (safe: slower, same math).
    On 0.12.4-0.12.x that flag is ignored: upgrade DeepSpeed or set `overlap_comm: false`.
    """

    issues = ("zero12-multi-rank-bucket",)
    root_cause = "DSC101"  # overlap_comm off is the workaround for both (#5242)
    code = "DSC104"
    name = "zero.multi-rank-bucket-allreduce"
    severity = Severity.WARNING
    summary = "use_multi_rank_bucket_allreduce on inside its 0.12.4 - 0.14.x regression window"
    signature = "nonfinite-hidden"
    evidence = (f"{DS}/issues/5242", f"{DS}/issues/5347", f"{DS}/pull/4946")
    examples = (
        Example(ZERO2_OVERLAP, valid=False, env={"deepspeed": "0.13.5"},
                fixed={"zero_optimization": {**ZERO2_OVERLAP["zero_optimization"],
                                             "use_multi_rank_bucket_allreduce": False}}),
        Example(ZERO2_OVERLAP, valid=False, env={"deepspeed": "0.12.6"}, note="flag ignored there: no config fix"),
        Example(ZERO2_OVERLAP, valid=True, env={"deepspeed": "0.12.3"}),
        Example({"zero_optimization": {"stage": 2, "overlap_comm": True, "use_multi_rank_bucket_allreduce": False}},
                valid=True, env={"deepspeed": "0.14.0"}),
        Example(ZERO2_SAFE, valid=True, env={"deepspeed": "0.12.6"}, note="overlap off: the #5242 workaround"),
    )

    def check(self, ctx: LintContext) -> Iterable[Finding]:
        in_window = kd.MULTI_RANK_BUCKET.affects("deepspeed", ctx.version("deepspeed"))
        if ctx.zero_stage not in (1, 2) or not ctx.multi_rank or not in_window:
            return
        if not ctx.overlap_comm:  # serialised reduction: the workaround that worked in #5242
            return
        flag = as_bool(ctx.section("zero_optimization").get("use_multi_rank_bucket_allreduce", True))
        version = ctx.version("deepspeed")
        if ctx.in_range("deepspeed", "0.12.4", "0.13.0"):
            yield self.finding(ctx, f"DeepSpeed {version} runs ZeRO-{ctx.zero_stage} through the multi-rank bucket "
                               "all-reduce path with overlap_comm (loss 0 / grad_norm 1.0 in #5242); this version ignores "
                               "use_multi_rank_bucket_allreduce: false", "zero_optimization.use_multi_rank_bucket_allreduce",
                               fix=Fix("upgrade DeepSpeed (>= 0.19.3) or set overlap_comm: false", safe=False),
                               severity=Severity.ERROR)
            return
        if flag is False:
            return
        fix = Fix("set zero_optimization.use_multi_rank_bucket_allreduce to false (slower, same math)", safe=True,
                  edits=(set_("zero_optimization.use_multi_rank_bucket_allreduce", False),))
        yield self.finding(ctx, f"use_multi_rank_bucket_allreduce is {'true' if flag else 'unset (default true)'} on "
                           f"DeepSpeed {version}, inside the 0.12.4-0.14.x window where this path gave loss 0 with "
                           "grad_norm 1.0 or nan (#5242, #5347)", "zero_optimization.use_multi_rank_bucket_allreduce", fix=fix)


def accumulation_steps(ctx: LintContext) -> float | None:
    """gradient_accumulation_steps as DeepSpeed will run it: the config's number ("auto" filled from the
    arguments), else the arguments', else 1 when nothing can derive it (no train_batch_size); None when unknown
    ("auto" without arguments, or derived from train_batch_size)."""
    written = ctx.config.get("gradient_accumulation_steps")
    steps = as_number(written)
    if steps is None:
        steps = as_number(ctx.arg("gradient_accumulation_steps"))
    if steps is None and written is None and ctx.config.get("train_batch_size") is None:
        return 1.0
    return steps


class Zero2GradientRegression(Rule):
    """ZeRO-2 with gradient accumulation on a DeepSpeed release that computes wrong gradients.

    What: two ZeRO-2 regressions give silently wrong gradients, no NaN and no skipped step.
    DeepSpeed 0.17.6-0.18.2 restart the ZeRO-1/2 epilogue's accumulator on every micro-batch, so with
    `gradient_accumulation_steps > 1` (and no optimizer offload) the step applies only the last
    micro-batch's gradient, divided by GA: grad norms several times lower than ZeRO-3 on the same seed
    (#7718; fixed in 0.18.3). DeepSpeed 0.18.3-0.19.5 (PR #7665) divide by GA only the gradient that
    flows through the engine's outputs: a loss that also runs the model inside the engine (a module used
    twice in the step) gives those parameters an unscaled gradient; reported with ZeRO-2 + bf16 on more
    than one rank (#8224, fixed by PR #8245 in 0.19.6). A config cannot show that code pattern, so that
    window is told at info level.

    Why it matters: a quieter failure than a NaN: the run trains with a different effective batch and
    learning rate than configured, and ZeRO-2 runs stop matching ZeRO-3 ones.

    Fix (manual, no config key fixes it): upgrade DeepSpeed to >= 0.19.6 (>= 0.18.3 for the first bug).
    Stop-gaps that change the run: ZeRO-3, or gradient_accumulation_steps 1 with a larger micro-batch.
    """

    issues = (kd.ZERO2_GA_LAST_MICROBATCH.id, kd.ZERO2_SHARED_LOSS_GA.id)
    code = "DSC119"
    name = "zero2.gradient-regression"
    severity = Severity.WARNING
    summary = "ZeRO-2 with gradient accumulation on DeepSpeed 0.17.6 - 0.19.5: wrong gradients"
    evidence = (*kd.ZERO2_GA_LAST_MICROBATCH.sources, *kd.ZERO2_SHARED_LOSS_GA.sources)
    _z2 = {"zero_optimization": {"stage": 2}, "gradient_accumulation_steps": 8}
    _bf16 = {**_z2, "bf16": {"enabled": True}}
    examples = (
        Example(_z2, valid=False, env={"deepspeed": "0.18.2"}),
        Example({**_z2, "gradient_accumulation_steps": "auto"}, valid=False, env={"deepspeed": "0.17.6"},
                args={"gradient_accumulation_steps": 4, "per_device_train_batch_size": 2}),
        Example({**_z2, "gradient_accumulation_steps": "auto"}, valid=False, env={"deepspeed": "0.18.0"},
                note="GA unknown: info"),
        Example(_bf16, valid=False, env={"deepspeed": "0.19.3"}, note="shared-loss window: info"),
        Example(_z2, valid=True, env={"deepspeed": "0.17.5"}),
        Example(_z2, valid=True, env={"deepspeed": "0.19.6"}),
        Example({**_z2, "gradient_accumulation_steps": 1}, valid=True, env={"deepspeed": "0.18.2"}),
        Example({"zero_optimization": {"stage": 2}}, valid=True, env={"deepspeed": "0.18.2"},
                note="no GA and no train_batch_size: DeepSpeed runs GA 1"),
        Example({**_z2, "zero_optimization": {"stage": 3}}, valid=True, env={"deepspeed": "0.18.2"}),
        Example({**_z2, "zero_optimization": {"stage": 1}}, valid=True, env={"deepspeed": "0.18.2"}),
        Example({**_z2, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}, valid=True,
                env={"deepspeed": "0.18.2"}, note="offload takes another code path: not this bug"),
        Example(_bf16, valid=True, env={"deepspeed": "0.19.3"}, args={"world_size": 1}),
        Example({**_z2, "bf16": {"enabled": False}}, valid=True, env={"deepspeed": "0.19.3"}),
        Example(_z2, valid=True, note="DeepSpeed version unknown"),
        Example(_z2, valid=True, env={"deepspeed": "0.18.2"}, options={"route_unread": "acc.yaml: ds.json cannot be read"},
                note="accelerate YAML whose config file is unread: the stage is accelerate's default"),
    )

    def check(self, ctx: LintContext) -> Iterable[Finding]:
        if ctx.zero_stage != 2 or ctx.options.get("route_unread"):  # unread file: the stage is a default, not
            return  # the run's (DSC003 says so)
        version = ctx.version("deepspeed")
        steps = accumulation_steps(ctx)
        if steps is not None and steps <= 1:
            return
        ga = f"gradient_accumulation_steps {steps:g}" if steps else "gradient accumulation (if GA > 1)"
        if kd.ZERO2_GA_LAST_MICROBATCH.affects("deepspeed", version) and ctx.ds.offload_optimizer is False:
            yield self.finding(ctx, f"DeepSpeed {version} ZeRO-2 with {ga} keeps only the last micro-batch's "
                               "gradient (#7718, fixed in 0.18.3): grad norms several times lower than ZeRO-3, "
                               "a smaller and noisier update than configured", "zero_optimization.stage",
                               fix=Fix(kd.ZERO2_GA_LAST_MICROBATCH.fix, safe=False),
                               severity=Severity.WARNING if steps else Severity.INFO)
        elif (kd.ZERO2_SHARED_LOSS_GA.affects("deepspeed", version) and ctx.multi_rank
              and ctx.bf16 is not False):
            yield self.finding(ctx, f"DeepSpeed {version} ZeRO-2 with {ga}: if the loss also runs the model "
                               "inside the engine (a module used twice in the step), that path's gradient is not "
                               "divided by GA (#8224, fixed by PR #8245 in 0.19.6)", "zero_optimization.stage",
                               fix=Fix(kd.ZERO2_SHARED_LOSS_GA.fix, safe=False), severity=Severity.INFO)
