"""The fault zoo as data: one `Scenario` per real failure mechanism, each paired with a healthy twin.

A scenario says what to build (model, data), how to train it (DeepSpeed config, Trainer arguments, or the raw
engine loop), which fault to inject and what lossguard should conclude (signature id from DESIGN.md and the
logged step where the symptom starts). Pure data: no torch import, so `lossguard` can list the zoo anywhere.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any


def ds_config(stage: int, *, precision: str = "fp32", **extra: Any) -> dict[str, Any]:
    """A DeepSpeed config shaped like the ones projects ship: batch sizes and clipping left to the Trainer."""
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": "auto",
        "train_batch_size": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "steps_per_print": 1,  # the engine's own `step=N, skipped=K, lr=[...]` line at every step
        "zero_optimization": {"stage": stage, "overlap_comm": False, "contiguous_gradients": True},
    }
    if precision == "bf16":
        config["bf16"] = {"enabled": True}
    elif precision == "fp16":
        config["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
                          "hysteresis": 2, "min_loss_scale": 1}
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key] = {**config[key], **value}
        else:
            config[key] = value
    return config


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    ds_config: dict[str, Any]
    signature: str | None  # DESIGN.md signature id; None for a healthy run
    onset_step: int | None  # first logged step showing the symptom
    twin: str | None = None  # the healthy run that differs only by the fault
    steps: int = 20
    trainer: dict[str, Any] = field(default_factory=dict)  # TrainingArguments overrides
    data: dict[str, Any] = field(default_factory=dict)  # data.build_dataset kwargs
    model: dict[str, Any] = field(default_factory=dict)  # {"kind": "gpt2"|"lora"|"vlm", ...}
    fault: dict[str, Any] | None = None  # faults.install spec
    engine: str = "trainer"  # "trainer" or "raw" (deepspeed.initialize loop, no Trainer)
    dies: bool = False  # the job is expected to exit non-zero

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(self.__dict__)


# LLaVA stage 1 on a pretrained LM: only the projector trains. Without the pretraining a random-init LM answers
# every prefix with the uniform guess (loss ln 64), nothing can learn, and the run really is dead.
VLM_STAGE1 = {"kind": "vlm", "tune_mm_mlp_adapter": True, "pretrain_lm_steps": 200}

_S: list[Scenario] = [
    # ---- healthy twins -------------------------------------------------------------------------------------
    Scenario("healthy-zero1", "fp32 ZeRO-1, correct template: loss falls.", ds_config(1), None, None),
    Scenario("healthy-zero2", "fp32 ZeRO-2, correct template: loss falls.", ds_config(2), None, None),
    Scenario("healthy-zero3", "fp32 ZeRO-3, correct template: loss falls.", ds_config(3), None, None),
    Scenario("healthy-bf16", "bf16 ZeRO-2 twin of bf16-nan, no fault.",
             ds_config(2, precision="bf16", bf16={"check_grad_overflow": False}), None, None),
    Scenario("healthy-ga", "ZeRO-2 with gradient_accumulation_steps=2.", ds_config(2), None, None,
             trainer={"gradient_accumulation_steps": 2}),
    Scenario("healthy-lora", "LoRA on c_attn, ZeRO-2, no gradient checkpointing.", ds_config(2), None, None,
             model={"kind": "lora"}, trainer={"learning_rate": 5e-3}),
    Scenario("healthy-fp16", "fp16 ZeRO-1 starting at loss scale 2^24: a few benign OVERFLOW skips while the "
             "scale calibrates, then normal training.",
             ds_config(1, precision="fp16", fp16={"initial_scale_power": 24}), None, None, steps=30,
             trainer={"log_level": "info"}),
    Scenario("memorization", "8 samples, 80 epochs at a constant high LR: the loss legitimately becomes tiny.",
             ds_config(2), "memorization", None, steps=80, data={"num_samples": 8},
             trainer={"learning_rate": 1e-2, "warmup_steps": 0, "lr_scheduler_type": "constant"}),
    Scenario("healthy-vlm", "Tiny VLM, LLaVA stage 2: projector and LM train, vision tower frozen, ZeRO-2.",
             ds_config(2), None, None, model={"kind": "vlm"}),
    Scenario("healthy-vlm-stage1", "Tiny VLM, LLaVA stage 1: the LM is first pretrained on the text (200 steps "
             "in-process, the pretrained LLM stage 1 starts from), then only the projector trains "
             "(tune_mm_mlp_adapter): the loss falls as the projector learns to feed the frozen LM.",
             ds_config(2), None, None, model=VLM_STAGE1, trainer={"learning_rate": 2e-2}),
    Scenario("healthy-long", "Twin of label-leakage: ZeRO-2, 300 steps at a constant LR 1e-2.", ds_config(2), None,
             None, steps=300, trainer={"learning_rate": 1e-2, "lr_scheduler_type": "constant", "warmup_steps": 0,
                      "disable_tqdm": True}),  # a batch-job log: 300 steps stay under 200 KB
    Scenario("lora-reentrant-hf", "LoRA + gradient_checkpointing=True, use_reentrant=True through TrainingArguments: "
             "transformers 5.23 calls enable_input_require_grads() itself, so this trains (kept to prove it).",
             ds_config(2), None, None, model={"kind": "lora"},
             trainer={"learning_rate": 5e-3, "gradient_checkpointing": True,
                      "gradient_checkpointing_kwargs": {"use_reentrant": True}}),
    Scenario("healthy-raw", "Raw DeepSpeed engine loop, bf16 ZeRO-2, no fault.",
             ds_config(2, precision="bf16", bf16={"check_grad_overflow": False}), None, None, engine="raw"),
    Scenario("healthy-raw-zero0", "Raw engine loop, fp32 ZeRO-0 (plain data parallel), no fault: every rank "
             "prints the same param_sum.", ds_config(0), None, None, engine="raw"),
    # ---- faults ----------------------------------------------------------------------------------------------
    Scenario("masked-labels", "Data rendered with the chatml template, masked with vicuna_v1 separators "
             "(LLaVA wrong --version): every sample hits 'tokenization mismatch' and all labels are -100.",
             ds_config(2), "masked-labels", 1, twin="healthy-zero2", data={"mask_template": "vicuna_v1"}),
    Scenario("truncated-answers", "max_length 10 is shorter than every prompt: truncation cuts every answer, "
             "all labels -100, no warning (LLaVA skips it when truncated).",
             ds_config(2), "masked-labels", 1, twin="healthy-zero2", data={"max_length": 10}),
    Scenario("bf16-nan", "bf16 ZeRO-2 with check_grad_overflow false; rank 0's loss is multiplied by inf at "
             "step 8: one non-finite gradient, Adam writes NaN into the weights.",
             ds_config(2, precision="bf16", bf16={"check_grad_overflow": False}), "nonfinite-hidden", 8,
             twin="healthy-bf16", fault={"kind": "inf-loss", "step": 8, "rank": 0, "once": True}),
    Scenario("bf16-nan-raw", "Raw engine loop, bf16 ZeRO-2, check_grad_overflow false, inf loss on rank 0 at "
             "step 8.", ds_config(2, precision="bf16", bf16={"check_grad_overflow": False}), "nonfinite", 8,
             twin="healthy-raw", engine="raw", fault={"kind": "inf-loss", "step": 8, "rank": 0, "once": True}),
    Scenario("fp16-overflow", "fp16 ZeRO-1, DeepSpeed WarmupLR; from step 8 the first block's output is x1e5, "
             "past 65504: every step overflows, is skipped, the LR freezes, the scale falls to its floor.",
             ds_config(1, precision="fp16", fp16={"initial_scale_power": 8},
                       scheduler={"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                                 "warmup_num_steps": "auto", "warmup_type": "linear"}}),
             "fp16-overflow", 8, twin="healthy-fp16", steps=24, dies=True,
             trainer={"warmup_steps": 15, "log_level": "info"},
             fault={"kind": "scale-hidden", "step": 8, "factor": 1e7}),
    Scenario("lora-reentrant", "LoRA + reentrant gradient checkpointing enabled the pre-5.x way (no "
             "enable_input_require_grads): nothing inside the checkpointed blocks gets a gradient.",
             ds_config(2), "no-grad-flow", 1, twin="healthy-lora",
             model={"kind": "lora", "reentrant_checkpointing": True}, trainer={"learning_rate": 5e-3}),
    Scenario("warmup-too-long", "warmup_steps 1000 in a 20-step run: the LR never climbs past 2% of its peak, the loss stays flat.",
             ds_config(2), "not-learning", 1, twin="healthy-zero2", trainer={"warmup_steps": 1000}),
    Scenario("lr-divergence", "learning rate 3.0: the loss blows up and does not come back.", ds_config(2),
             "divergence", 2, twin="healthy-zero2", trainer={"learning_rate": 3.0, "warmup_steps": 0,
                                                           "max_grad_norm": 0.0}),
    Scenario("frozen-projector", "VLM stage-1 (projector-only) run with freeze_mm_mlp_adapter copied from another "
             "script: the flags leave no parameter trainable; DeepSpeed ZeRO-2 crashes at init (IndexError).",
             ds_config(2), "no-grad-flow", None,
             twin="healthy-vlm", model={"kind": "vlm", "tune_mm_mlp_adapter": True, "freeze_mm_mlp_adapter": True},
             dies=True),
    Scenario("late-projector", "VLM stage 1; the projector is rebuilt after the DeepSpeed engine and its optimizer "
             "exist, so no optimizer parameter gets a gradient: DeepSpeed 0.19.8 ZeRO-1/2 crashes at the first "
             "gradient reduction (IndexError in reduce_ipg_grads) instead of training silently.", ds_config(2),
             "no-grad-flow", None, twin="healthy-vlm-stage1", model=VLM_STAGE1,
             trainer={"learning_rate": 2e-2}, fault={"kind": "late-module"}, dies=True),
    Scenario("label-leakage", "An all-attend 4-D mask replaces the causal mask: the next token leaks in and the "
             "loss collapses towards 0 with finite gradients, eval_loss low too (leakage, not overfitting).",
             ds_config(2), "memorization", None, twin="healthy-long", steps=300, fault={"kind": "open-causal-mask"},
             trainer={"learning_rate": 1e-2, "lr_scheduler_type": "constant", "warmup_steps": 0,
                      "disable_tqdm": True}),  # a batch-job log: 300 steps stay under 200 KB
    Scenario("rank-perturbed", "Raw engine loop, ZeRO-0 (plain data parallel): rank 1's replica is nudged after "
             "the engine's broadcast, so the ranks train different weights.", ds_config(0), "rank-desync", 1,
             twin="healthy-raw-zero0", engine="raw", fault={"kind": "perturb-replica", "rank": 1, "scale": 0.05}),
]

SCENARIOS: dict[str, Scenario] = {s.name: s for s in _S}


def get(name: str) -> Scenario:
    try:
        return SCENARIOS[name]
    except KeyError:
        raise KeyError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}") from None
