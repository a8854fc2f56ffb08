"""Root causes, held as data (built from KNOWLEDGE.md §2-§5).

Each cause names the signatures it explains with a prior, conditions that raise or lower it, the
evidence links, the fix and the experiment that confirms it. A condition is
`(key, op, value, factor, reason)`: `key` is a RunFacts field, `event:NAME` (count of that log
event), `finding:CODE` (a detector fired), `CODE.key` (a number that finding carries, e.g.
`LOSS007.eval_ratio`) or `onset_at_start`; `op` is one of
`==`, `in`, `>=`, `<=`, `version_in` ([low, high) on a version string). The factor multiplies the score
when the condition holds on a known value; unknown facts change nothing.
"""

from __future__ import annotations

DS = "https://github.com/deepspeedai/DeepSpeed"
HF = "https://github.com/huggingface/transformers"

ZERO12 = ("zero_stage", "in", [1, 2], 2.0, "ZeRO stage {value} (the races are in ZeRO-1/2)")
NOT_ZERO12 = ("zero_stage", "in", [0, 3], 0.1, "ZeRO stage {value} has no ZeRO-1/2 reduction race")
OVERLAP_ON = ("overlap_comm", "==", True, 2.5, "overlap_comm is true")
OVERLAP_OFF = ("overlap_comm", "==", False, 0.05, "overlap_comm is false")
SINGLE_RANK = ("world_size", "==", 1, 0.05, "a single rank cannot race on reduction")

CAUSES: list[dict] = [
    {
        "id": "zero12-overlap-race",
        "title": "ZeRO-1/2 overlap_comm gradient-reduction race corrupts the averaged gradient",
        "signatures": {"nonfinite-hidden": 0.45, "nonfinite": 0.35, "zero-loss": 0.15},
        "conditions": [
            ZERO12, NOT_ZERO12, OVERLAP_ON, OVERLAP_OFF, SINGLE_RANK,
            ("deepspeed_version", "version_in", ["0.8.0", "0.14.3"], 3.0,
             "DeepSpeed {value} is in the 0.8.0-0.14.2 race window (fixed by PR #5606 in 0.14.3)"),
            ("deepspeed_version", "version_in", ["0.19.3", None], 0.3,
             "DeepSpeed {value} has the known overlap fixes (#5606, #7805, #7965, #8080)"),
            ("communication_data_type", "==", "fp32", 1.5,
             "communication_data_type fp32 widens the race window"),
            ("num_nodes", ">=", 2, 1.5, "{value} nodes: slower communication widens the race window"),
        ],
        "evidence": [f"{DS}/issues/4298", f"{DS}/pull/5606", f"{DS}/issues/5545"],
        "fix": 'set "zero_optimization": {"overlap_comm": false} (or upgrade DeepSpeed to >= 0.19.3)',
        "confirm": "lossguard probe CONFIG: same seed with overlap_comm true vs false; only the overlap arm dies",
    },
    {
        "id": "zero12-multi-rank-bucket",
        "title": "use_multi_rank_bucket_allreduce path regression, DeepSpeed 0.12.4-0.14.x",
        "signatures": {"nonfinite-hidden": 0.2, "nonfinite": 0.15},
        "conditions": [
            ZERO12, NOT_ZERO12, SINGLE_RANK,
            ("deepspeed_version", "version_in", ["0.12.4", "0.15.0"], 4.0,
             "DeepSpeed {value} is in the 0.12.4-0.14.x window bisected in #5242"),
            ("deepspeed_version", "version_in", [None, "0.12.4"], 0.1, "DeepSpeed {value} predates PR #4695"),
            ("deepspeed_version", "version_in", ["0.15.0", None], 0.2, "DeepSpeed {value} is past the window"),
            ("use_multi_rank_bucket_allreduce", "==", False, 0.1, "use_multi_rank_bucket_allreduce is false"),
            ("use_multi_rank_bucket_allreduce", "==", True, 1.5, "use_multi_rank_bucket_allreduce is true"),
        ],
        "evidence": [f"{DS}/issues/5242", f"{DS}/issues/5347", f"{DS}/pull/4946"],
        "fix": 'set "zero_optimization": {"use_multi_rank_bucket_allreduce": false, "overlap_comm": false}, '
               "or upgrade DeepSpeed",
        "confirm": "probe with use_multi_rank_bucket_allreduce false; DeepSpeed 0.12.3 is fine",
    },
    {
        "id": "zero12-pingpong-index-reset",
        "title": "IPG ping-pong buffer index reset, DeepSpeed 0.17.2-0.17.4",
        "signatures": {"nonfinite-hidden": 0.05, "nonfinite": 0.05},
        "conditions": [
            ZERO12, NOT_ZERO12, OVERLAP_OFF, SINGLE_RANK,
            ("deepspeed_version", "version_in", ["0.17.2", "0.17.5"], 30.0,
             "DeepSpeed {value} resets the IPG buffer index (PR #6993, fixed by #7371 in 0.17.5)"),
            ("deepspeed_version", "version_in", [None, "0.17.2"], 0.01, "DeepSpeed {value} predates PR #6993"),
            ("deepspeed_version", "version_in", ["0.17.5", None], 0.01, "DeepSpeed {value} has the fix"),
        ],
        "evidence": [f"{DS}/pull/7371", f"{DS}/pull/7805", f"{DS}/issues/7804"],
        "fix": "upgrade DeepSpeed to >= 0.18.5 (or 0.17.5), or set overlap_comm false",
        "confirm": "probe overlap_comm true vs false; ZeRO-3 survives",
    },
    {
        "id": "zero12-buffer-lifetime",
        "title": "reduction-stream buffer recycled before the all-reduce finished, DeepSpeed < 0.19.0",
        "signatures": {"nonfinite-hidden": 0.1, "nonfinite": 0.1},
        "conditions": [
            ZERO12, NOT_ZERO12, OVERLAP_ON, OVERLAP_OFF, SINGLE_RANK,
            ("deepspeed_version", "version_in", ["0.14.3", "0.19.0"], 2.5,
             "DeepSpeed {value} lacks the record_stream fix of PR #7965 (0.19.0)"),
            ("deepspeed_version", "version_in", ["0.19.0", None], 0.05, "DeepSpeed {value} has PR #7965"),
            ("num_nodes", ">=", 2, 2.0, "{value} nodes"),
        ],
        "evidence": [f"{DS}/pull/7965", "https://github.com/hiyouga/LlamaFactory/issues/8137"],
        "fix": 'upgrade DeepSpeed to >= 0.19.0, or set "overlap_comm": false',
        "confirm": "probe overlap_comm true vs false",
    },
    {
        "id": "bf16-no-overflow-check",
        "title": "bf16 ZeRO applies a non-finite gradient: no overflow check, so one bad step kills the weights",
        "signatures": {"nonfinite-hidden": 0.35, "nonfinite": 0.3},
        "conditions": [
            ("bf16", "==", True, 2.0, "bf16 is on"),
            ("fp16", "==", True, 0.05, "fp16 runs skip overflowing steps"),
            ("check_grad_overflow", "==", False, 3.0, "bf16.check_grad_overflow is false"),
            ("check_grad_overflow", "==", True, 0.15, "bf16.check_grad_overflow is true"),
            ("deepspeed_version", "version_in", ["0.11.2", "0.19.3"], 1.5,
             "DeepSpeed {value}: bf16 ZeRO skips no step by default (PR #4512; default flipped in 0.19.3)"),
            ("zero_stage", "==", 3, 1.5, "ZeRO-3 has no bf16 overflow check at all"),
        ],
        "evidence": [f"{DS}/pull/4512", f"{DS}/pull/6976", f"{DS}/pull/8035"],
        "fix": 'set "bf16": {"enabled": true, "check_grad_overflow": true} (DeepSpeed >= 0.17.1, ZeRO-1/2), '
               "then find what produced the first non-finite gradient",
        "confirm": "probe with check_grad_overflow true: the run survives, skipped_steps counts the bad step",
    },
    {
        "id": "fp16-activation-overflow",
        "title": "fp16 activations exceed 65504 (a bf16-pretrained model trained in fp16): every step overflows",
        "signatures": {"fp16-overflow": 0.8, "nonfinite-hidden": 0.05, "lr-zero": 0.3},
        "conditions": [
            ("fp16", "==", True, 2.0, "fp16 is on"),
            ("bf16", "==", True, 0.1, "the run is bf16"),
            ("event:overflow", ">=", 1, 2.0, "{value} DeepSpeed OVERFLOW lines"),
            ("event:scale-at-minimum", ">=", 1, 2.0, "the loss scale hit its minimum"),
        ],
        "evidence": ["https://github.com/zai-org/GLM-4/issues/96", "https://github.com/QwenLM/Qwen-VL/issues/352",
                     "https://github.com/hiyouga/LlamaFactory/issues/4202"],
        "fix": "train in bf16 on a bf16-capable GPU (or fp32); never fp16 for Qwen/GLM/Gemma-class models",
        "confirm": "probe fp16 vs bf16 (or fp32): only the fp16 arm skips steps; or run one step with "
                   'debug="underflow_overflow"',
    },
    {
        "id": "attention-kernel-nan",
        "title": "attention kernel produces NaN gradients (cuDNN SDPA in torch 2.5.0 / >= 2.9 on H100)",
        "signatures": {"nonfinite-hidden": 0.1, "nonfinite": 0.12},
        "conditions": [
            ("torch_version", "version_in", ["2.5.0", "2.5.1"], 5.0, "torch {value} defaults to cuDNN SDPA on H100"),
            ("torch_version", "version_in", ["2.9.0", None], 1.3, "torch {value} re-enabled cuDNN SDPA on SM90/100"),
            ("event:cudnn-sdpa", ">=", 1, 6.0, "cuDNN SDPA backward warning in the log"),
            ("onset_at_start", "==", True, 2.0, "NaN from the first logged step"),
        ],
        "evidence": ["https://github.com/pytorch/pytorch/issues/138649",
                     "https://github.com/pytorch/pytorch/issues/139298",
                     "https://github.com/hiyouga/LlamaFactory/issues/9631"],
        "fix": "torch.backends.cuda.enable_cudnn_sdp(False), or switch attn_implementation (sdpa <-> eager / "
               "flash_attention_2); avoid torch 2.5.0",
        "confirm": "rerun a few steps with cuDNN SDPA disabled",
    },
    {
        "id": "lr-too-high",
        "title": "learning rate too high or a bad batch: the loss or gradient spikes, then diverges",
        "signatures": {"divergence": 0.7, "loss-spike": 0.6, "nonfinite": 0.15, "nonfinite-hidden": 0.1},
        "conditions": [
            ("finding:LOSS006", "==", True, 2.0, "a loss spike came before"),
            ("finding:LOSS005", "==", True, 2.0, "the loss diverged"),
            ("onset_at_start", "==", True, 0.5, "trouble from the very first step"),
        ],
        "evidence": ["https://github.com/hiyouga/LLaMA-Factory/issues/1989", "https://github.com/QwenLM/Qwen/issues/967"],
        "fix": "lower the learning rate, add warmup, clip gradients (max_grad_norm 1.0); for bf16 ZeRO also "
               'set "check_grad_overflow": true',
        "confirm": "probe the same seed at half the learning rate",
    },
    {
        "id": "masked-batch-nan",
        "title": "a fully masked batch under mean-reduced cross-entropy returns NaN and poisons the weights",
        "signatures": {"nonfinite-hidden": 0.1, "nonfinite": 0.1},
        "conditions": [
            ("event:tokenization-mismatch", ">=", 1, 4.0, "{value} tokenization-mismatch warnings"),
            ("event:response-key-missing", ">=", 1, 4.0, "{value} 'Could not find response key' warnings"),
            ("onset_at_start", "==", True, 1.5, "NaN from the first logged step"),
        ],
        "evidence": ["https://github.com/QwenLM/Qwen3-VL/issues/1981"],
        "fix": "drop samples with zero supervised tokens in preprocessing, or use a sum / num_items loss",
        "confirm": "log (labels[..., 1:] != -100).sum() per micro-batch (the live guard does)",
    },
    {
        "id": "template-mismatch",
        "title": "conversation template / tokenizer mismatch masks every target",
        "signatures": {"masked-labels": 0.55, "zero-loss": 0.35},
        "conditions": [
            ("event:tokenization-mismatch", ">=", 1, 5.0, "{value} 'tokenization mismatch' warnings"),
        ],
        "evidence": ["https://github.com/haotian-liu/LLaVA/issues/1166", "https://github.com/lm-sys/FastChat/issues/2494",
                     "https://github.com/OpenGVLab/InternVL/issues/254"],
        "fix": "use the conversation template the model was trained with (--version / conv_style / chat_template); "
               "decode one batch where labels != -100 and check it is the assistant turn",
        "confirm": "count supervised tokens per batch; decode the supervised span",
    },
    {
        "id": "truncation-cuts-answers",
        "title": "max length too small: truncation removes every answer token",
        "signatures": {"masked-labels": 0.35, "zero-loss": 0.25},
        "conditions": [
            ("event:response-key-missing", ">=", 1, 5.0, "{value} 'Could not find response key' warnings"),
        ],
        "evidence": ["https://github.com/InternLM/InternLM-XComposer/issues/419"],
        "fix": "raise model_max_length / cutoff_len, truncate prompts from the left, drop over-long samples",
        "confirm": "histogram of tokenized lengths vs max_length; supervised tokens per batch",
    },
    {
        "id": "image-token-mismatch",
        "title": "VLM image-token count mismatch: the model multiplies the loss by 0",
        "signatures": {"masked-labels": 0.05, "zero-loss": 0.05},
        "conditions": [("event:image-token-mismatch", ">=", 1, 40.0, "{value} image-token mismatch warnings")],
        "evidence": ["https://github.com/OpenGVLab/InternVL/issues/254"],
        "fix": "keep image tokens from being truncated; check max_dynamic_patch / force_image_size",
        "confirm": "count <IMG_CONTEXT> tokens vs ViT embeddings per sample",
    },
    {
        "id": "lora-reentrant-checkpointing",
        "title": "LoRA + reentrant gradient checkpointing with frozen inputs: no gradient reaches the adapters",
        "signatures": {"no-grad-flow": 0.55, "not-learning": 0.3},
        "conditions": [
            ("event:no-input-grad", ">=", 1, 3.0, "PyTorch warned 'None of the inputs have requires_grad=True'"),
            ("event:reentrant-checkpoint", ">=", 1, 1.5, "reentrant checkpointing warning"),
            ("lora", "==", True, 2.0, "LoRA adapters"),
            ("gradient_checkpointing", "==", True, 2.0, "gradient checkpointing on"),
        ],
        "evidence": ["https://github.com/microsoft/LoRA/issues/120", "https://github.com/huggingface/trl/issues/2486"],
        "fix": 'gradient_checkpointing_kwargs={"use_reentrant": False}, or model.enable_input_require_grads()',
        "confirm": "after one step, count LoRA B weights with non-zero norm (0 means no gradient)",
    },
    {
        "id": "trainable-not-optimized",
        "title": "trainable set != optimised set: frozen by a flag mistake, or a module created after the "
                 "optimizer",
        "signatures": {"no-grad-flow": 0.45, "not-learning": 0.35},
        "conditions": [
            ("event:trainable-params", ">=", 1, 1.0, ""),
            ("event:trainable-not-in-optimizer", ">=", 1, 10.0, "parameters outside the optimizer"),
        ],
        "evidence": ["https://github.com/hiyouga/LLaMA-Factory/issues/2546"],
        "fix": "create / unfreeze modules before building the optimizer (deepspeed.initialize); check tune_* "
               "and freeze_* flags; compare trainable names with optimizer param ids",
        "confirm": "diff {n for n, p in model.named_parameters() if p.requires_grad} against the optimizer params",
    },
    {
        "id": "scheduler-not-stepping",
        "title": "the LR scheduler never leaves 0: warmup longer than the run, or DeepSpeed skips every step",
        "signatures": {"lr-zero": 0.6},
        "conditions": [("event:lr-before-step", ">=", 1, 2.0, "the Trainer warned the scheduler has not stepped"),
                       ("event:overflow", ">=", 1, 0.3, "")],
        "evidence": [f"{HF}/pull/36973"],
        "fix": "check warmup_steps / warmup_ratio against max_steps; check for skipped steps",
        "confirm": "print lr_scheduler.get_last_lr() for the first steps",
    },
    {
        "id": "lr-too-small",
        "title": "the learning rate never gets large enough to move the weights: warmup longer than the run, "
                 "or a learning rate orders of magnitude too small",
        "signatures": {"not-learning": 0.4, "lr-zero": 0.2},
        "conditions": [("event:lr-before-step", ">=", 1, 0.5, "")],
        "evidence": [f"{HF}/pull/36973"],
        "fix": "check warmup_steps / warmup_ratio against max_steps and the peak learning rate "
               "(`lossguard lint` rule DSC114 checks warmup against the run length)",
        "confirm": "plot the logged learning rate: it should reach its peak well before the end",
    },
    {
        "id": "weights-not-updating",
        "title": "the optimizer is not changing the weights (LR 0, all parameters frozen, or steps skipped)",
        "signatures": {"not-learning": 0.35, "zero-loss": 0.05},
        "conditions": [("finding:LR001", "==", True, 3.0, "the learning rate is 0")],
        "evidence": [],
        "fix": "check the learning rate, requires_grad on the parameters you mean to train, and skipped steps",
        "confirm": "compare a weight tensor before and after one step",
    },
    {
        "id": "label-leakage",
        "title": "label leakage through the attention mask (defeated causal mask, packing): loss collapses",
        "signatures": {"memorization": 0.25},
        "conditions": [("transformers_version", "version_in", ["4.42.1", "4.42.4"], 4.0,
                        "transformers {value}: Gemma-2 4-D mask bug (#31673)"),
                       ("LOSS007.eval_ratio", "<=", 0.5, 12.0,
                        "eval_loss fell too ({value:.2f} of the initial loss): held-out data is predicted as "
                        "well as training data, so the answers are visible"),
                       ("LOSS007.eval_ratio", ">=", 1.0, 0.2, "")],
        "evidence": [f"{HF}/issues/31673", "https://github.com/karpathy/minGPT/issues/75"],
        "fix": "verify causality: perturbing token t+1 must not change logits at position t",
        "confirm": "causality probe on one batch",
    },
    {
        "id": "benign-memorization",
        "title": "benign memorisation of a small dataset: the loss is truly tiny",
        "signatures": {"memorization": 0.75},
        "conditions": [("LOSS007.eval_ratio", ">=", 1.0, 3.0,
                        "eval_loss ({value:.2f} of the initial loss) rose while the training loss vanished: "
                        "overfitting a small dataset")],
        "evidence": [],
        "fix": "nothing is broken; check eval_loss for overfitting, use more data or fewer epochs",
        "confirm": "eval_loss finite; grad_norm finite and varying",
    },
    {
        "id": "replica-divergence",
        "title": "data-parallel replicas drifted apart: a rank-local update or corrupted all-reduce",
        "signatures": {"rank-desync": 1.0},
        "conditions": [],
        "evidence": ["https://github.com/NVIDIA/nccl/issues/1199"],
        "fix": "look for rank-local code paths (if rank == ...) touching weights; rerun with NCCL_PROTO=Simple, "
               "NCCL_NVLS_ENABLE=0; run nccl-tests all_reduce_perf -c 1",
        "confirm": "compare weight checksums across ranks at the onset step",
    },
]
