"""Known DeepSpeed issues: ZeRO-1/2 gradient-reduction races and precision defaults that turn a transient
NaN into a dead run. Windows checked against the DeepSpeed release tags that hold each fix."""

from __future__ import annotations

from lossguard.knowledge.issue import KnownIssue, VersionWindow

DS = "https://github.com/deepspeedai/DeepSpeed"
_ZERO12_OVERLAP = "ZeRO-1/2, overlap_comm true, more than one rank"

OVERLAP_RACE = KnownIssue(
    id="zero12-overlap-race",
    title="ZeRO-1/2 overlap_comm gradient-reduction race corrupts the averaged gradient",
    mechanism="PR #2500 (0.8.0) removed a stream sync: backward could overwrite an IPG bucket still being "
              "reduced when communication is slower than compute. PR #5606 (0.14.3) added the wait.",
    windows=(VersionWindow("deepspeed", "0.8.0", "0.14.3"),),
    config=_ZERO12_OVERLAP + "; worse across nodes, with fp32 communication or small buckets",
    symptoms="loss normal, then 0.0 after a varying number of steps; grad_norm NaN or a sentinel (1.0, 1.414)",
    fix='set "zero_optimization": {"overlap_comm": false} (or upgrade DeepSpeed to >= 0.19.3)',
    confirm="lossguard probe CONFIG: same seed with overlap_comm true vs false; only the overlap arm dies",
    sources=(f"{DS}/issues/4298", f"{DS}/pull/5606", f"{DS}/issues/5545"),
)

MULTI_RANK_BUCKET = KnownIssue(
    id="zero12-multi-rank-bucket",
    title="use_multi_rank_bucket_allreduce path regression, DeepSpeed 0.12.4-0.14.x",
    mechanism="PR #4695 (0.12.4) replaced the per-rank reduce with flatten -> all_reduce -> copy-back on the "
              "reduction stream; a user bisect found loss 0 with grad_norm 1.0 (0.12.4-0.12.6) or nan (0.13.5). "
              "Until 0.13.0 (PR #4946) ZeRO-2 ignored use_multi_rank_bucket_allreduce: false.",
    windows=(VersionWindow("deepspeed", "0.12.4", "0.15.0"),),
    config=_ZERO12_OVERLAP + ", use_multi_rank_bucket_allreduce true (the default)",
    symptoms="grad_norm pinned at 1.0 or nan, loss 0",
    fix='set "zero_optimization": {"use_multi_rank_bucket_allreduce": false, "overlap_comm": false}, '
        "or upgrade DeepSpeed",
    confirm="probe with use_multi_rank_bucket_allreduce false; DeepSpeed 0.12.3 is fine",
    sources=(f"{DS}/issues/5242", f"{DS}/issues/5347", f"{DS}/pull/4946"),
)

PINGPONG_RESET = KnownIssue(
    id="zero12-pingpong-index-reset",
    title="IPG ping-pong buffer index reset, DeepSpeed 0.17.2-0.17.4",
    mechanism="PR #6993 (0.17.2) reset the IPG bucket index in clear(), so both halves of the double buffer "
              "were reused while in flight; PR #7371 (0.17.5) fixed the corruption, PR #7805 (0.18.5) the overlap.",
    windows=(VersionWindow("deepspeed", "0.17.2", "0.17.5"),),
    config=_ZERO12_OVERLAP + ", contiguous_gradients true",
    symptoms="loss 0.0 from about step 3, grad_norm 1.414; ZeRO-3 fine",
    fix="upgrade DeepSpeed to >= 0.18.5 (or 0.17.5), or set overlap_comm false",
    confirm="probe overlap_comm true vs false; ZeRO-3 survives",
    sources=(f"{DS}/pull/7371", f"{DS}/pull/7805", f"{DS}/issues/7804"),
)

BUFFER_LIFETIME = KnownIssue(
    id="zero12-buffer-lifetime",
    title="reduction-stream buffer recycled before the all-reduce finished, DeepSpeed < 0.19.0",
    mechanism="temporaries used on the reduction stream were not record_stream-ed, so the caching allocator "
              "could recycle them before the queued communication finished; fixed by PR #7965 (0.19.0).",
    windows=(VersionWindow("deepspeed", None, "0.19.0"),),
    config=_ZERO12_OVERLAP,
    symptoms="ZeRO-2 loss turns NaN (or logs 0.0) after some steps, ZeRO-3 fine; more often across nodes",
    fix='upgrade DeepSpeed to >= 0.19.0, or set "overlap_comm": false',
    confirm="probe overlap_comm true vs false",
    sources=(f"{DS}/pull/7965", "https://github.com/hiyouga/LlamaFactory/issues/8137"),
)

COMPILE_STREAM_RACE = KnownIssue(
    id="zero12-compile-stream-race",
    title="IPG bucket filled from several CUDA streams under torch.compile, DeepSpeed < 0.19.3",
    mechanism="average_tensor waited only on the current stream while compiled gradient hooks copied into the "
              "same IPG bucket from several streams; fixed by PR #8080 (0.19.3).",
    windows=(VersionWindow("deepspeed", None, "0.19.3"),),
    config=_ZERO12_OVERLAP + ", torch.compile",
    symptoms="NaN loss from step 1",
    fix="upgrade DeepSpeed to >= 0.19.3, or set overlap_comm false",
    confirm="rerun without torch.compile, or with overlap_comm false",
    sources=(f"{DS}/issues/8061", f"{DS}/pull/8080"),
)

COMM_DTYPE_FP32 = KnownIssue(
    id="zero12-fp32-communication",
    title="communication_data_type fp32 in a bf16 run widens the ZeRO-1/2 overlap race window",
    mechanism="an explicit fp32 communication dtype upcasts every bf16 gradient bucket: twice the bytes and "
              "extra work on the reduction stream, the 'communication slower than compute' condition of the "
              "overlap races. A risk multiplier, not a bug by itself (inferred).",
    windows=(VersionWindow("deepspeed", None, "0.19.0"),),
    config=_ZERO12_OVERLAP + ', bf16, "communication_data_type": "fp32"',
    symptoms="as the overlap race: loss to 0 within a few steps after a gradient spike",
    fix="remove communication_data_type (bf16 runs then reduce in bf16), or set overlap_comm false",
    confirm="probe with and without communication_data_type",
    sources=("https://github.com/QwenLM/Qwen/issues/967", f"{DS}/pull/5606", f"{DS}/pull/7965"),
)

BF16_NO_OVERFLOW_CHECK = KnownIssue(
    id="bf16-no-overflow-check",
    title="bf16 ZeRO applies a non-finite gradient: no overflow check, so one bad step kills the weights",
    mechanism="bf16 ZeRO-1/2 skips no step on a NaN/Inf gradient (PR #4512, 0.11.2); the check_grad_overflow "
              "option came in 0.17.1 and became the default in 0.19.3; ZeRO-3 has no bf16 check at all. The "
              "engine's optimizer, not the framework around it: a trainer loop with no bf16 NaN check of its own "
              "is framework-bf16-no-nan-check.",
    windows=(VersionWindow("deepspeed", "0.11.2", "0.19.3"),),
    config="bf16, ZeRO-1/2 without check_grad_overflow true, or ZeRO-3",
    symptoms="one NaN gradient, then NaN weights and a logged loss of 0.0 forever",
    fix='set "bf16": {"enabled": true, "check_grad_overflow": true} (DeepSpeed >= 0.17.1, ZeRO-1/2), '
        "then find what produced the first non-finite gradient",
    confirm="probe with check_grad_overflow true: the run survives, skipped_steps counts the bad step",
    sources=(f"{DS}/pull/4512", f"{DS}/pull/6976", f"{DS}/pull/8035"),
)

BF16_UNCLIPPED = KnownIssue(
    id="bf16-unclipped",
    title="bf16 ZeRO-1/2 neither computes the gradient norm nor clips, DeepSpeed 0.9.2-0.9.5",
    mechanism="PR #3166 skipped the norm computation and clipping for non-fp16 runs; reverted by PR #3790 in 0.10.0.",
    windows=(VersionWindow("deepspeed", "0.9.2", "0.10.0"),),
    config="bf16, ZeRO-1/2",
    symptoms="grad_norm logged as 0.0; unclipped updates",
    fix="upgrade DeepSpeed to >= 0.10.0",
    confirm="the logged grad_norm is 0.0 on every step while the loss moves",
    sources=(f"{DS}/pull/3166", f"{DS}/pull/3790"),
)

ZERO3_STREAM_RACE = KnownIssue(
    id="zero3-stream-race",
    title="ZeRO-3 bf16 weight partitions turn NaN with torch >= 2.10, DeepSpeed < 0.18.8",
    mechanism="the ZeRO-3 reduce stream waited on the default stream rather than the current one; fixed by "
              "PR #7898 in 0.18.8.",
    windows=(VersionWindow("deepspeed", None, "0.18.8"), VersionWindow("torch", "2.10.0", None)),
    config="ZeRO-3, bf16",
    symptoms="NaN loss and gradients after some steps",
    fix="upgrade DeepSpeed to >= 0.18.8",
    confirm="rerun on DeepSpeed >= 0.18.8 or torch < 2.10 with the same seed",
    sources=(f"{DS}/pull/7898",),
)

# Both windows checked on the sdists: 0.17.6-0.18.2 test `averaged_gradients[i] is None` in the ZeRO-1/2 epilogue,
# 0.18.3 tests `all_grad_tensors[i]`; the engine-backward graph tracker of PR #8245 is absent from 0.19.5 and
# present in 0.19.6 (runtime/engine.py, `_backward_prologue_per_tensor`).
ZERO2_GA_LAST_MICROBATCH = KnownIssue(
    id="zero2-ga-last-microbatch",
    title="ZeRO-2 with gradient accumulation keeps only the last micro-batch's gradient, DeepSpeed 0.17.6-0.18.2",
    mechanism="0.17.6 moved ZeRO-1/2 gradient accumulation into the backward epilogue but decided 'first "
              "micro-batch of the window' by testing averaged_gradients, which stays empty until the boundary: "
              "every micro-batch restarts the accumulator, so the step applies only the last micro-batch's "
              "gradient, still divided by gradient_accumulation_steps. Not a NaN: a silently smaller, noisier "
              "update (an effective batch of one micro-batch and a learning rate about GA times too small). "
              "ZeRO-1 reduces once per window and ZeRO-3 keeps its own counter, so neither is affected; neither "
              "is a run with CPU/NVMe optimizer offload (another branch). 0.18.3 tests the accumulator itself.",
    windows=(VersionWindow("deepspeed", "0.17.6", "0.18.3"),),
    config="ZeRO-2, gradient_accumulation_steps > 1, no offload_optimizer",
    symptoms="grad_norm several times lower than ZeRO-3 (or DeepSpeed < 0.17.6) on the same seed and data, the "
             "first losses identical; the loss falls more slowly; no NaN, no skipped step",
    fix="upgrade DeepSpeed to >= 0.18.3 (or pin < 0.17.6); as a stop-gap use ZeRO-3, or "
        "gradient_accumulation_steps 1 with a larger micro-batch",
    confirm="same seed and data for a few steps on ZeRO-2 vs ZeRO-3 (or DeepSpeed 0.18.3): the grad_norm differs "
            "from the first step, by a factor that grows with gradient_accumulation_steps",
    sources=(f"{DS}/issues/7718", "https://github.com/huggingface/trl/issues/4540"),
)

ZERO2_SHARED_LOSS_GA = KnownIssue(
    id="zero2-shared-loss-ga-scaling",
    title="loss combining the engine and the model inside it: part of the gradient escapes the accumulation "
          "scaling, DeepSpeed 0.18.3-0.19.5",
    mechanism="PR #7665 (0.18.3, PyTorch-compatible backward) divides gradients by gradient_accumulation_steps in "
              "hooks on the engine's outputs. When one loss also runs a forward through the model inside the "
              "engine (engine.module, or a submodule called directly, so a module is used twice in the step), "
              "the gradient through that second path is not divided: those parameters get a gradient up to GA "
              "times too large. Reported with ZeRO-2 + bf16 on more than one rank; fixed by PR #8245 (0.19.6), "
              "which scales the whole loss once in engine.backward.",
    windows=(VersionWindow("deepspeed", "0.18.3", "0.19.6"),),
    config="ZeRO-2 and bf16 as reported, more than one rank, gradient_accumulation_steps > 1, and custom loss "
           "code that calls the wrapped model (or one of its submodules) besides the engine in the same step",
    symptoms="no NaN and no skipped step: a grad_norm larger than on ZeRO-3 / DeepSpeed >= 0.19.6 for the same "
             "seed, and a loss that learns differently (spikes or slower convergence) on those runs only",
    fix="upgrade DeepSpeed to >= 0.19.6; or call every forward of the step through the engine; or set "
        "gradient_accumulation_steps 1",
    confirm="compare the gradient of a shared parameter after one accumulation window against "
            "gradient_accumulation_steps 1 with the same samples (or DeepSpeed 0.19.6)",
    sources=(f"{DS}/issues/8224", f"{DS}/pull/8245", f"{DS}/pull/7665"),
)

# Removals checked on the sdists: 0.19.6 has none of these guards; 0.19.7 rejects the first set (and drops
# the 1-bit optimizers from engine.py), 0.19.8 adds the second (runtime/config.py _reject_removed_config_keys).
REMOVED_0197 = KnownIssue(
    id="deepspeed-removed-0197",
    title="DeepSpeed 0.19.7 removed Nebula, the compression library, MoQ, sparse attention, MiCS and 1-bit "
          "optimizers: a config that names them no longer starts",
    mechanism="DeepSpeedConfig raises DeepSpeedConfigError for the top-level keys nebula, compression_training, "
              "quantize_training, sparse_attention and for zero_optimization.mics_shard_size / "
              "mics_hierarchical_params_gather; OneBitAdam, ZeroOneAdam and OneBitLamb are no longer known "
              "optimizer types (the engine looks them up in torch.optim and fails).",
    windows=(VersionWindow("deepspeed", "0.19.7", None),),
    config="one of those keys, or optimizer.type OneBitAdam / ZeroOneAdam / OneBitLamb",
    symptoms="DeepSpeedConfigError (or AttributeError: module 'torch.optim' has no attribute ...) at start-up",
    fix="remove the key (or switch the optimizer to Adam/AdamW), or pin DeepSpeed < 0.19.7",
    confirm="lossguard lint --deepspeed-schema CONFIG with the cluster's DeepSpeed",
    sources=(f"{DS}/issues/8489",),
)

REMOVED_0198 = KnownIssue(
    id="deepspeed-removed-0198",
    title="DeepSpeed 0.19.8 removed Apex AMP, sparse embedding gradients, eigenvalue MoQ, elasticity, graph "
          "harvesting, legacy curriculum learning, progressive layer drop and LoCo-ZeRO++",
    mechanism="DeepSpeedConfig raises DeepSpeedConfigError for the top-level keys amp, sparse_gradients, "
              "eigenvalue, elasticity, graph_harvesting, curriculum_learning, progressive_layer_drop and for "
              "zero_optimization.zeropp_loco_param.",
    windows=(VersionWindow("deepspeed", "0.19.8", None),),
    config="one of those keys",
    symptoms="DeepSpeedConfigError at start-up naming the key",
    fix="remove the key (curriculum learning moves to data_efficiency.data_sampling.curriculum_learning), or "
        "pin DeepSpeed < 0.19.8",
    confirm="lossguard lint --deepspeed-schema CONFIG with the cluster's DeepSpeed",
    sources=(f"{DS}/issues/8489",),
)

ISSUES = (OVERLAP_RACE, MULTI_RANK_BUCKET, PINGPONG_RESET, BUFFER_LIFETIME, COMPILE_STREAM_RACE, COMM_DTYPE_FP32,
          BF16_NO_OVERFLOW_CHECK, BF16_UNCLIPPED, ZERO3_STREAM_RACE, ZERO2_GA_LAST_MICROBATCH, ZERO2_SHARED_LOSS_GA,
          REMOVED_0197, REMOVED_0198)
