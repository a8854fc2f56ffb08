"""Known issues outside DeepSpeed's reduction path: numerics, attention kernels, data and label masking,
gradients that never reach the weights, schedulers, label leakage."""

from __future__ import annotations

from lossguard.knowledge.issue import KnownIssue, VersionWindow

HF = "https://github.com/huggingface/transformers"
LF = "https://github.com/hiyouga/LLaMA-Factory"

FP16_ACTIVATION_OVERFLOW = KnownIssue(
    id="fp16-activation-overflow",
    title="fp16 activations exceed 65504 (a bf16-pretrained model trained in fp16): every step overflows",
    mechanism="models pre-trained in bf16 (Qwen, GLM-4, Gemma) have hidden states beyond fp16's range; every "
              "step overflows, the dynamic loss scale falls to its floor and DeepSpeed skips every step.",
    config="fp16 on a bf16-pretrained model (often V100 / T4 / 2080Ti)",
    symptoms="OVERFLOW! Skipping step on every step, loss scale at its minimum, learning rate frozen",
    fix="train in bf16 on a bf16-capable GPU (or fp32); never fp16 for Qwen/GLM/Gemma-class models",
    confirm='probe fp16 vs bf16 (or fp32): only the fp16 arm skips steps; or run one step with '
            'debug="underflow_overflow"',
    sources=("https://github.com/zai-org/GLM-4/issues/96", "https://github.com/QwenLM/Qwen-VL/issues/352",
             "https://github.com/hiyouga/LlamaFactory/issues/4202"),
)

ATTENTION_KERNEL_NAN = KnownIssue(
    id="attention-kernel-nan",
    title="attention kernel produces NaN gradients (cuDNN SDPA in torch 2.5.0 / >= 2.9 on H100)",
    mechanism="torch 2.5.0 made cuDNN SDPA the default on H100 and it returned NaN gradients (opt-in again in "
              "2.5.1); 2.9 re-enabled it on SM90/SM100 and shape-dependent NaN bugs followed. A CPU build "
              "has no cuDNN.",
    windows=(VersionWindow("torch", "2.5.0", "2.5.1"), VersionWindow("torch", "2.9.0", None)),
    config="a CUDA build of torch on Hopper / Blackwell GPUs, attn_implementation sdpa",
    symptoms="NaN gradients from the first backward, then loss 0.0 and grad_norm nan",
    fix="torch.backends.cuda.enable_cudnn_sdp(False), or switch attn_implementation (sdpa <-> eager / "
        "flash_attention_2); avoid torch 2.5.0",
    confirm="rerun a few steps with cuDNN SDPA disabled",
    sources=("https://github.com/pytorch/pytorch/issues/138649", "https://github.com/pytorch/pytorch/issues/139298",
             "https://github.com/hiyouga/LlamaFactory/issues/9631"),
)

LR_TOO_HIGH = KnownIssue(
    id="lr-too-high",
    title="learning rate too high or a bad batch: the loss or gradient spikes, then diverges",
    mechanism="an update too large for the curvature (or one outlier batch) throws the weights out of the "
              "basin; without clipping or an overflow skip one such step can produce NaN.",
    symptoms="loss spikes, then rises for good or turns NaN",
    fix="lower the learning rate, add warmup, clip gradients (max_grad_norm 1.0); for bf16 ZeRO also "
        'set "check_grad_overflow": true',
    confirm="probe the same seed at half the learning rate",
    sources=(f"{LF}/issues/1989", "https://github.com/QwenLM/Qwen/issues/967"),
)

MASKED_BATCH_NAN = KnownIssue(
    id="masked-batch-nan",
    title="a fully masked batch under mean-reduced cross-entropy returns NaN and poisons the weights",
    mechanism="cross-entropy averaged over zero supervised tokens is 0/0 = NaN; bf16 ZeRO applies that "
              "gradient and the weights die.",
    config="samples whose labels are all -100 (template mismatch, truncation)",
    symptoms="NaN (or loss 0.0 with grad_norm 1.414) from the first batch that has no supervised token",
    fix="drop samples with zero supervised tokens in preprocessing, or use a sum / num_items loss",
    confirm="log (labels[..., 1:] != -100).sum() per micro-batch (the live guard does)",
    sources=("https://github.com/QwenLM/Qwen3-VL/issues/1981",),
)

TEMPLATE_MISMATCH = KnownIssue(
    id="template-mismatch",
    title="conversation template / tokenizer mismatch masks every target",
    mechanism="the masking code tokenizes each turn on its own and the lengths disagree with the full "
              "conversation, so the training script masks the whole sample (LLaVA / FastChat warn "
              "'tokenization mismatch').",
    symptoms="loss exactly 0.0 from the start, 'tokenization mismatch' warnings",
    fix="use the conversation template the model was trained with (--version / conv_style / chat_template); "
        "decode one batch where labels != -100 and check it is the assistant turn",
    confirm="count supervised tokens per batch; decode the supervised span",
    sources=("https://github.com/haotian-liu/LLaVA/issues/1166", "https://github.com/lm-sys/FastChat/issues/2494",
             "https://github.com/OpenGVLab/InternVL/issues/254"),
)

TRUNCATION_CUTS_ANSWERS = KnownIssue(
    id="truncation-cuts-answers",
    title="max length too small: truncation removes every answer token",
    mechanism="the prompt (and image tokens) fill model_max_length / cutoff_len, so the answer is cut off and "
              "no label is left to learn from.",
    symptoms="loss 0.0 on long samples; 'Could not find response key' warnings",
    fix="raise model_max_length / cutoff_len, truncate prompts from the left, drop over-long samples",
    confirm="histogram of tokenized lengths vs max_length; supervised tokens per batch",
    sources=("https://github.com/InternLM/InternLM-XComposer/issues/419",),
)

IMAGE_TOKEN_MISMATCH = KnownIssue(
    id="image-token-mismatch",
    title="VLM image-token count mismatch: the model multiplies the loss by 0",
    mechanism="when the number of image-context tokens differs from the vision embeddings, InternVL-style "
              "models catch the error and zero the loss on purpose.",
    symptoms="loss 0.0 on some steps, a tensor-size warning naming vit_embeds",
    fix="keep image tokens from being truncated; check max_dynamic_patch / force_image_size",
    confirm="count <IMG_CONTEXT> tokens vs ViT embeddings per sample",
    sources=("https://github.com/OpenGVLab/InternVL/issues/254",),
)

LORA_REENTRANT = KnownIssue(
    id="lora-reentrant-checkpointing",
    title="LoRA + reentrant gradient checkpointing with frozen inputs: no gradient reaches the adapters",
    mechanism="reentrant checkpointing only builds a graph when an input requires grad; with a frozen "
              "embedding nothing does, so the adapters inside the checkpointed blocks get no gradient.",
    config="PEFT / LoRA, gradient_checkpointing with use_reentrant true, no enable_input_require_grads()",
    symptoms="grad_norm 0 while the loss is non-zero and flat; 'None of the inputs have requires_grad=True'",
    fix='gradient_checkpointing_kwargs={"use_reentrant": False}, or model.enable_input_require_grads()',
    confirm="after one step, count LoRA B weights with non-zero norm (0 means no gradient)",
    sources=("https://github.com/microsoft/LoRA/issues/120", "https://github.com/huggingface/trl/issues/2486"),
)

TRAINABLE_NOT_OPTIMIZED = KnownIssue(
    id="trainable-not-optimized",
    title="trainable set != optimised set: frozen by a flag mistake, or a module created after the optimizer",
    mechanism="tune_* / freeze_* flags applied in the wrong order freeze the module meant to train, or a module "
              "rebuilt after deepspeed.initialize gets gradients the optimizer never applies.",
    symptoms="grad_norm 0 or the loss flat; parameters that require grad are missing from the optimizer",
    fix="create / unfreeze modules before building the optimizer (deepspeed.initialize); check tune_* "
        "and freeze_* flags; compare trainable names with optimizer param ids",
    confirm="diff {n for n, p in model.named_parameters() if p.requires_grad} against the optimizer params",
    sources=(f"{LF}/issues/2546",),
)

SCHEDULER_NOT_STEPPING = KnownIssue(
    id="scheduler-not-stepping",
    title="the LR scheduler never leaves 0: warmup longer than the run, or every step skipped (fp16 overflow)",
    mechanism="the learning rate follows the scheduler, which only advances on optimizer steps that are "
              "taken; a warmup longer than the run or skipped steps keep it at 0.",
    symptoms="learning_rate 0.0 on every log, loss flat",
    fix="check warmup_steps / warmup_ratio against max_steps; check for skipped steps",
    confirm="print lr_scheduler.get_last_lr() for the first steps",
    sources=(f"{HF}/pull/36973",),
)

LR_TOO_SMALL = KnownIssue(
    id="lr-too-small",
    title="the learning rate never gets large enough to move the weights: warmup longer than the run, "
          "or a learning rate orders of magnitude too small",
    mechanism="the weights move, but too little for the loss to change in the steps the run has.",
    symptoms="loss flat; the learning rate tiny or still warming up at the end",
    fix="check warmup_steps / warmup_ratio against max_steps and the peak learning rate "
        "(`lossguard lint` rule DSC114 checks warmup against the run length)",
    confirm="plot the logged learning rate: it should reach its peak well before the end",
    sources=(f"{HF}/pull/36973",),
)

WEIGHTS_NOT_UPDATING = KnownIssue(
    id="weights-not-updating",
    title="the optimizer is not changing the weights (LR 0, all parameters frozen, or steps skipped)",
    mechanism="with no effective update the model computes the same loss on the same data: flat or repeating.",
    symptoms="loss flat or repeating exactly",
    fix="check the learning rate, requires_grad on the parameters you mean to train, and skipped steps",
    confirm="compare a weight tensor before and after one step",
)

LABEL_LEAKAGE = KnownIssue(
    id="label-leakage",
    title="label leakage through the attention mask (defeated causal mask, packing): loss collapses",
    mechanism="a position that can attend to the token it predicts copies it: the loss falls to ~0 fast on "
              "training and held-out data alike (transformers 4.42.1-4.42.3 Gemma-2 4-D sliding mask).",
    windows=(VersionWindow("transformers", "4.42.1", "4.42.4"),),
    symptoms="loss collapses to ~0 within a few steps, eval_loss too",
    fix="verify causality: perturbing token t+1 must not change logits at position t",
    confirm="causality probe on one batch",
    sources=(f"{HF}/issues/31673", "https://github.com/karpathy/minGPT/issues/75"),
)

BENIGN_MEMORIZATION = KnownIssue(
    id="benign-memorization",
    title="benign memorisation of a small dataset: the loss is truly tiny",
    mechanism="a large model learns a small dataset by heart; the training loss rounds to 0.0 while eval_loss "
              "rises. Nothing is broken.",
    symptoms="fast decay to a tiny loss, finite varying grad_norm, eval_loss rising",
    fix="nothing is broken; check eval_loss for overfitting, use more data or fewer epochs",
    confirm="eval_loss finite; grad_norm finite and varying",
)

REPLICA_DIVERGENCE = KnownIssue(
    id="replica-divergence",
    title="data-parallel replicas drifted apart: a rank-local update or corrupted all-reduce",
    mechanism="data-parallel ranks must hold identical weights; code that updates weights on one rank only, "
              "or corrupted communication (NCCL, hardware), makes them differ.",
    symptoms="weight fingerprints (or losses on the same batch) differ across ranks",
    fix="look for rank-local code paths (if rank == ...) touching weights; rerun with NCCL_PROTO=Simple, "
        "NCCL_NVLS_ENABLE=0; run nccl-tests all_reduce_perf -c 1",
    confirm="compare weight checksums across ranks at the onset step",
    sources=("https://github.com/NVIDIA/nccl/issues/1199",),
)

GA_LOSS_SCALE = KnownIssue(
    id="transformers-ga-loss-scale",
    title="transformers 4.46.0 - 4.48.x report wrongly scaled losses with gradient accumulation",
    mechanism="4.46 made the Trainer divide the summed token loss by num_items_in_batch (the tokens of the whole "
              "accumulation window) instead of averaging per micro-batch; its follow-ups regressed: losses 5x-10x "
              "higher (#34263), the loss doubled at gradient_accumulation_steps 2 in 4.47 (reported on #35207 and "
              "#35438), very large with models taking loss_kwargs in 4.48.0 (#35663, "
              "fixed by #35651). When the scaled loss is the one backpropagated, grad_norm is inflated by the same "
              "factor (clipping then hides part of it). Models that do not accept loss_kwargs kept a loss that "
              "grows with gradient_accumulation_steps in later 4.x releases too (#37766), outside this window.",
    windows=(VersionWindow("transformers", "4.46.0", "4.49.0"),),
    config="gradient_accumulation_steps > 1",
    symptoms="logged loss (and often grad_norm) about GA times too high, or too low, from the first log on; the "
             "curve keeps its shape: not a dead run, but thresholds and comparisons break",
    fix="upgrade transformers to >= 4.49",
    confirm="log the loss with gradient_accumulation_steps 1 and compare",
    sources=(f"{HF}/issues/34263", f"{HF}/issues/35663", f"{HF}/pull/35651"),
)

NUMERICAL_INSTABILITY = KnownIssue(
    id="numerical-nan",
    title="NaN/Inf from numerical instability: an fp16 overflow, a learning rate too high, or a bad batch",
    mechanism="the first non-finite value comes from the forward or backward pass itself: activations past "
              "fp16's 65504 (half precision on a bf16-pretrained model, or a V100 / T4 without bf16), an "
              "update too large for the curvature, or one outlier batch (empty target, extreme length). Without "
              "an overflow skip (bf16, plain AdamW, a custom loop) the NaN gradient is applied and every later "
              "step is NaN.",
    config="fp16 / half precision, a high learning rate, no gradient clipping",
    symptoms="loss or grad norm turns nan / inf (often after a spike) and stays so; eval loss NaN",
    fix="train in bf16 (or fp32) instead of fp16; lower the learning rate and add warmup; clip gradients "
        "(max_grad_norm 1.0); drop batches with no supervised token; resume from the last finite checkpoint",
    confirm="rerun from the last good checkpoint with bf16 (or fp32) and with half the learning rate; "
            'TrainingArguments(debug="underflow_overflow") names the first layer that overflows',
    sources=("https://github.com/karpathy/nanoGPT/issues/215", f"{LF}/issues/4202", f"{LF}/issues/1989"),
)

EVAL_ONLY_NAN = KnownIssue(
    id="eval-batch-nan",
    title="NaN in evaluation only: an evaluation batch with no supervised token averages 0 by 0",
    mechanism="a mean-reduced cross-entropy over zero supervised tokens is 0/0 = NaN, and one NaN batch makes "
              "the averaged evaluation loss NaN. Training rarely shows it: the Trainer's NaN filter hides a NaN "
              "training loss, sum-reduced losses give 0 for such a batch, and only evaluation averages every "
              "batch as it is. Any evaluation sample whose labels are all masked does it: answers truncated "
              "by the max length, a template that masks the whole sample, packing, or a sequence split across "
              "context-parallel ranks so that one shard holds no label (axolotl#3026 is one example).",
    config="evaluation samples that can lose every label: long samples with truncation, packing, context "
           "parallelism / sequence sharding, a template mismatch",
    symptoms="eval_loss nan while the training loss and grad norm stay finite and learn",
    fix="drop evaluation samples with no supervised token, average with a token-weighted sum across batches "
        "and shards (or nanmean), or raise the evaluation max length",
    confirm="count supervised tokens per eval batch (and per shard): the NaN batch has 0",
    sources=("https://github.com/axolotl-ai-cloud/axolotl/issues/3026",),
)

RL_DEGENERATE_REWARDS = KnownIssue(
    id="rl-zero-advantage",
    title="GRPO groups with identical rewards: every advantage is 0, so the policy gradient vanishes",
    mechanism="GRPO normalises each completion's reward by its group's mean and std; when all completions of "
              "a prompt score the same (reward std 0), every advantage is 0, the policy loss and gradient are "
              "0, and with beta 0 there is no KL term either: the step changes nothing.",
    config="GRPO / RLOO with few generations per prompt, low temperature, or reward functions that rarely "
           "tell completions apart",
    symptoms="loss 0.0 and grad_norm 0.0 with reward_std 0 and frac_reward_zero_std near 1",
    fix="make the rewards discriminate (graded, not pass/fail), sample more generations per prompt or at a "
        "higher temperature, filter prompts that are always solved or never solved",
    confirm="log the per-group reward std: the zero-gradient steps are those whose groups all have std 0",
    sources=("https://github.com/huggingface/trl/issues/3857", "https://github.com/huggingface/trl/issues/2703"),
)

RL_UPDATE_LOST = KnownIssue(
    id="rl-update-lost",
    title="RL step with varying rewards but a gradient of exactly 0: the update never reaches the weights",
    mechanism="when the rewards differ inside a group, the group-normalised advantages are non-zero, so the "
              "policy loss has a non-zero gradient on every trainable parameter it depends on. A gradient norm "
              "of exactly 0.0 then means that no trainable parameter received it: the parameters are frozen "
              "(requires_grad false, an adapter attached to no module), the norm and the optimizer see other "
              "parameters than the loss (a policy wrapped or copied after the optimizer was built, a reference "
              "model mixed up with the policy), or the engine drops the gradient (ms-swift#5890 with an old "
              "DeepSpeed ZeRO release is one example). A KL of 0 beside it says the policy never moved from "
              "the reference.",
    config="GRPO / PPO / RLOO under any trainer; LoRA or partially frozen policies, DeepSpeed ZeRO",
    symptoms="grad_norm 0.0 (and kl 0.0) on every step while reward and reward_std vary",
    fix="check that the policy's trainable parameters require grad and are the ones in the optimizer; with "
        "DeepSpeed, upgrade it and the RL framework to current releases",
    confirm="after one step, compare a trainable weight before and after, and the trainable parameter names "
            "with the optimizer's; or run one step without DeepSpeed",
    sources=("https://github.com/modelscope/ms-swift/issues/5890",),
)

ZERO_GRAD_MISSING = KnownIssue(
    id="zero-grad-missing",
    title="gradients accumulate across steps: the training loop never calls optimizer.zero_grad()",
    mechanism="backward() adds into .grad; without zero_grad() (or set_to_none) once per optimizer step, each "
              "step applies the sum of every gradient since the start. The first steps still point downhill, so "
              "the loss falls; then the stale sum dominates, the update no longer follows the current batch and "
              "keeps pushing past the minimum, and the loss climbs back steadily. A grad_norm read from .grad grows "
              "with the step count instead of shrinking. A hand-written loop is the usual place (zero_grad "
              "called once per epoch, or only on some branch); a framework can do it too: DeepSpeed's ZeRO-0 bf16 "
              "path skipped zero_grad until PR #7839 (0.18.6).",
    config="a hand-written training loop (plain PyTorch, accelerate without the Trainer); the HF Trainer and "
           "engine.step() of DeepSpeed ZeRO-1/2/3 zero the gradients themselves",
    symptoms="loss falls for the first steps, then rises steadily and does not come back; grad_norm grows step "
             "after step; no NaN at first, no skipped step",
    fix="call optimizer.zero_grad(set_to_none=True) once per optimizer step (after step(), or before the first "
        "backward of the next accumulation window); with gradient accumulation, only at the window boundary",
    confirm="print one parameter's .grad norm just before backward(): it must be 0 (or None) at the start of "
            "every window; or rerun a few steps with zero_grad() added: the rise disappears",
    sources=("https://github.com/IBM/aihwkit/issues/446", "https://github.com/pytorch/pytorch/issues/47175",
             "https://github.com/deepspeedai/DeepSpeed/pull/7839"),
)

FRAMEWORK_BF16_NO_NAN_CHECK = KnownIssue(
    id="framework-bf16-no-nan-check",
    title="the training framework's bf16 path has no NaN check: the NaN step is applied and the log hides it "
          "(loss field missing, skipped / NaN counters at 0)",
    mechanism="Megatron-style loops (Megatron-DeepSpeed, older Megatron-LM and forks, GPT-NeoX) detect Inf/NaN "
              "only through the fp16 loss scaler. bf16 has no scaler, so no step is skipped, and their 'number "
              "of skipped iterations' / 'number of nan iterations' counters, which count only skipped steps, stay "
              "0 while the NaN gradient reaches the weights. The iteration line prints a loss only when its "
              "average is > 0, and NaN > 0 is false: the 'lm loss' field vanishes instead of reading nan. This "
              "is the framework's own loop and logging, whatever engine runs below; bf16-no-overflow-check is "
              "the DeepSpeed ZeRO optimizer skipping no step in bf16, a versioned DeepSpeed bug with a config "
              "switch (check_grad_overflow). Both can hold at once; fixing that one leaves this one.",
    config="bf16 under a Megatron-style trainer (Megatron-DeepSpeed, Megatron-LM run with "
           "--no-check-for-nan-in-loss-and-grad, GPT-NeoX) or any loop whose only overflow check is the fp16 "
           "loss scaler",
    symptoms="from one iteration on the loss field is missing from the log line (or reads nan), grad norm nan, "
             "while 'number of skipped iterations: 0 | number of nan iterations: 0' and loss scale 1.0",
    fix="turn the framework's NaN check on (recent Megatron-LM checks by default: drop "
        "--no-check-for-nan-in-loss-and-grad) or stop on the first non-finite loss with a monitor; resume from "
        "the last finite checkpoint, then find what produced the first NaN (learning rate, data, kernel)",
    confirm="the last iteration line that still has a loss is the onset; eval or a forward on the saved "
            "weights gives NaN",
    sources=("https://github.com/deepspeedai/Megatron-DeepSpeed/pull/434",
             "https://github.com/epfLLM/Megatron-LLM/issues/33",
             "https://github.com/bigscience-workshop/Megatron-DeepSpeed/issues/396"),
)

DPO_POLICY_IS_REFERENCE = KnownIssue(
    id="dpo-policy-equals-reference",
    title="DPO policy identical to its reference: loss exactly ln 2 = 0.6931 and rewards exactly 0 on every log",
    mechanism="DPO's implicit reward is beta * (log pi(y|x) - log pi_ref(y|x)). When the policy and the "
              "reference give the same log-probabilities every reward is 0, the margin is 0 and the loss is "
              "-log sigmoid(0) = ln 2 = 0.693147; rewards/accuracies (chosen > rejected, strictly) is 0. Healthy "
              "runs show that only before the first update. On every log it means the two never differ: the "
              "policy is not updated (learning rate 0, adapter frozen or disabled in the policy forward, no "
              "trainable parameter), the reference is the policy itself (the same model object, or a PEFT model "
              "whose adapter is disabled for both passes, or reference log-probs recomputed from the current "
              "policy), or no completion token is scored (logps/chosen and logps/rejected exactly 0: every "
              "completion label masked).",
    config="DPO / IPO and relatives (TRL DPOTrainer, LLaMA-Factory, ms-swift), often with PEFT and ref_model=None "
           "or precompute_ref_log_probs",
    symptoms="loss 0.6931 (0.6932 in bf16) and rewards/chosen, rewards/rejected, rewards/margins exactly 0, "
             "rewards/accuracies 0, on every log; logps/chosen and logps/rejected vary by batch (or are exactly 0 "
             "when every completion is masked)",
    fix="make the policy trainable and updated (learning rate > 0, adapter enabled and trainable, optimizer "
        "holding the policy's parameters); give the reference its own frozen copy (or let the trainer disable "
        "the adapter only for the reference pass); check that completion tokens keep their labels",
    confirm="after one step compare a policy weight before and after, and the policy's log-prob of one pair with "
            "the reference's: they must differ",
    sources=("https://github.com/huggingface/trl/issues/1311", "https://github.com/huggingface/trl/issues/1843",
             "https://github.com/Yifan-Song793/ETO/issues/14"),
)

# Confirmed by a two-rank Trainer run (tests/integration/test_lint_hazards_real.py); DeepSpeed's default
# gradient_clipping is 0.0 up to 0.19.2 and 1.0 from 0.19.3 (runtime/constants.py in the sdists).
CLIPPING_DROPPED = KnownIssue(
    id="hf-clipping-dropped",
    title="HF Trainer + DeepSpeed config without gradient_clipping: --max_grad_norm is silently dropped",
    mechanism="the HF integration fills only keys the config has (fill_match), and under DeepSpeed the Trainer "
              "leaves clipping to the engine, so DeepSpeed's own default applies: no clipping before 0.19.3, "
              "a fixed 1.0 from 0.19.3 whatever --max_grad_norm says.",
    windows=(VersionWindow("deepspeed", None, "0.19.3"),),
    config="HF Trainer (or TRL / LLaMA-Factory / axolotl), DeepSpeed config without a gradient_clipping key",
    symptoms="grad_norm spikes that the script's max_grad_norm should have bounded; loss spikes or divergence",
    fix='add "gradient_clipping": "auto" to the DeepSpeed config',
    confirm="print trainer.model_wrapped.gradient_clipping() after trainer.train() starts: it is not max_grad_norm",
    sources=(f"{HF}/blob/main/src/transformers/integrations/deepspeed.py",
             "https://github.com/deepspeedai/DeepSpeed/blob/master/deepspeed/runtime/constants.py"),
)

ISSUES = (FP16_ACTIVATION_OVERFLOW, ATTENTION_KERNEL_NAN, LR_TOO_HIGH, MASKED_BATCH_NAN, TEMPLATE_MISMATCH,
          TRUNCATION_CUTS_ANSWERS, IMAGE_TOKEN_MISMATCH, LORA_REENTRANT, TRAINABLE_NOT_OPTIMIZED,
          SCHEDULER_NOT_STEPPING, LR_TOO_SMALL, WEIGHTS_NOT_UPDATING, LABEL_LEAKAGE, BENIGN_MEMORIZATION,
          REPLICA_DIVERGENCE, GA_LOSS_SCALE, NUMERICAL_INSTABILITY, EVAL_ONLY_NAN, RL_DEGENERATE_REWARDS,
          RL_UPDATE_LOST, CLIPPING_DROPPED, ZERO_GRAD_MISSING, FRAMEWORK_BF16_NO_NAN_CHECK,
          DPO_POLICY_IS_REFERENCE)
