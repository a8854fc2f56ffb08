"""Known issues of PyTorch FSDP as the HF Trainer and accelerate drive it: settings that stop a run at start-up
or train it wrongly, read from the accelerate YAML, the Trainer's `fsdp` / `fsdp_config` and the versions."""

from __future__ import annotations

from lossguard.knowledge.issue import KnownIssue, VersionWindow

HF = "https://github.com/huggingface/transformers"

CHECKPOINTING_TWICE = KnownIssue(
    id="fsdp-checkpointing-twice",
    title="FSDP activation_checkpointing and the Trainer's gradient_checkpointing both on: the Trainer refuses "
          "to start",
    mechanism="the Trainer reads activation_checkpointing from its fsdp_config, or from the accelerate FSDP "
              "plugin the launcher's YAML filled, and raises ValueError when gradient_checkpointing is also "
              "True: the two would wrap the same layers twice (and the HF one re-gathers the sharded layer "
              "in backward).",
    windows=(VersionWindow("transformers", "4.35.0", None),),
    config="FSDP (accelerate YAML fsdp_activation_checkpointing, or the Trainer's fsdp_config "
           "activation_checkpointing) with gradient_checkpointing True under the HF Trainer",
    symptoms="ValueError at Trainer start-up: The activation_checkpointing in FSDP config and the "
             "gradient_checkpointing in training arg can't be set to True simultaneously",
    fix="keep one: FSDP's activation_checkpointing (recommended under FSDP) and gradient_checkpointing False",
    confirm="the ValueError names both settings; with either one off the Trainer starts",
    sources=(f"{HF}/pull/25771", f"{HF}/issues/30404", f"{HF}/pull/31578"),
)

PEFT_FLAT_PARAMS = KnownIssue(
    id="fsdp-peft-flat-params",
    title="FSDP1 with use_orig_params false and LoRA on transformers < 4.39: the model cannot be wrapped",
    mechanism="with use_orig_params False every FSDP unit flattens its parameters into one FlatParameter, "
              "which must be all trainable or all frozen; a decoder layer holding frozen base weights and "
              "trainable LoRA weights fails. From transformers 4.39 the Trainer wraps a LoRA model with "
              "PEFT's own auto-wrap policy (each LoRA layer its own unit, PR #29587); before it, the YAML's "
              "TRANSFORMER_BASED_WRAP put both in one unit.",
    windows=(VersionWindow("transformers", None, "4.39.0"),),
    config="FSDP1, use_orig_params false, a LoRA / QLoRA adapter (frozen base weights), the HF Trainer",
    symptoms="ValueError at wrapping: Must flatten tensors with uniform requires_grad when "
             "use_orig_params=False (older torch: `FlatParameter` requires uniform `requires_grad`)",
    fix="set fsdp_use_orig_params: true, or upgrade transformers to >= 4.39 (PEFT's wrap policy)",
    confirm="the ValueError at accelerator.prepare names requires_grad; it is gone with use_orig_params true",
    sources=("https://github.com/pytorch/pytorch/issues/104690", "https://github.com/pytorch/pytorch/issues/91167",
             "https://github.com/huggingface/peft/issues/1702", f"{HF}/pull/29587"),
)

ISSUES = (CHECKPOINTING_TWICE, PEFT_FLAT_PARAMS)
