"""`"auto"` in a DeepSpeed config, filled for probe's built-in job as the HF Trainer fills it. Pure: no torch.

A config written for the HF Trainer (LLaVA's, most repos') leaves values to the Trainer as `"auto"`. DeepSpeed
itself cannot read them: handed over as they are, `reduce_bucket_size: "auto"` fails DeepSpeed's config
validation before the first step. The Trainer fills them in two passes (transformers
`integrations/deepspeed.py`, `HfTrainerDeepSpeedConfig.trainer_config_process` and `trainer_config_finalize`);
`fill` applies the same rules with the built-in job's own settings (`JobSettings`) and its tiny model's hidden
size. Only `"auto"` values change: a value the user wrote is never touched.

`--cmd` jobs fill their own (their Trainer does it); probe leaves their config as written.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

AUTO = "auto"

# What the built-in job trains with (probe/train_job.py reads these): the values an "auto" takes.
MICRO_BATCH = 4
GRAD_ACCUM = 1
GRAD_CLIP = 1.0
LEARNING_RATE = 1e-3
TINY_HIDDEN_SIZE = 32  # probe/model.py tiny_gpt2(n_embd=32)


@dataclass(frozen=True)
class JobSettings:
    """The TrainingArguments the HF Trainer would have: the source of every filled value."""

    world_size: int = 2
    steps: int = 20
    hidden_size: int = TINY_HIDDEN_SIZE
    precision: str = "bf16"  # for `bf16.enabled` / `fp16.enabled` "auto": the built-in job's own choice
    micro_batch: int = MICRO_BATCH
    grad_accum: int = GRAD_ACCUM
    max_grad_norm: float = GRAD_CLIP
    learning_rate: float = LEARNING_RATE
    adam_betas: tuple[float, float] = (0.9, 0.999)  # TrainingArguments' defaults
    adam_epsilon: float = 1e-8
    weight_decay: float = 0.0
    warmup_steps: int = 0

    def values(self) -> dict[str, Any]:
        """Dotted key -> the value the Trainer puts where the config says "auto" (trainer_config_process,
        then trainer_config_finalize's scheduler and hidden-size keys)."""
        return {
            "train_micro_batch_size_per_gpu": self.micro_batch,
            "gradient_accumulation_steps": self.grad_accum,
            "train_batch_size": self.world_size * self.micro_batch * self.grad_accum,
            "gradient_clipping": self.max_grad_norm,
            "optimizer.params.lr": self.learning_rate,
            "optimizer.params.betas": list(self.adam_betas),
            "optimizer.params.eps": self.adam_epsilon,
            "optimizer.params.weight_decay": self.weight_decay,
            "scheduler.params.warmup_min_lr": 0,
            "scheduler.params.warmup_max_lr": self.learning_rate,
            "fp16.enabled": self.precision == "fp16",
            "bf16.enabled": self.precision == "bf16",
            "zero_optimization.reduce_bucket_size": self.hidden_size * self.hidden_size,
            "scheduler.params.total_num_steps": self.steps,
            # deepspeed >= 0.19.6 rejects a non-positive warmup: the Trainer keeps it at 1 or more.
            "scheduler.params.warmup_num_steps": max(1, self.warmup_steps),
        }

    def zero3_values(self) -> dict[str, Any]:
        """Filled only under ZeRO-3, as the Trainer does (DeepSpeed ignores an "auto" there below stage 3)."""
        return {
            "zero_optimization.stage3_prefetch_bucket_size": int(0.9 * self.hidden_size * self.hidden_size),
            "zero_optimization.stage3_param_persistence_threshold": 10 * self.hidden_size,
        }


def fill(config: dict[str, Any], settings: JobSettings) -> tuple[dict[str, Any], dict[str, Any]]:
    """(a copy of `config` with every fillable "auto" replaced, {dotted key: value filled})."""
    out = copy.deepcopy(config)
    filled: dict[str, Any] = {}
    rules = dict(settings.values())
    if _stage(out) == 3:
        rules.update(settings.zero3_values())
    for key, value in rules.items():
        node, leaf = _node(out, key)
        if node is not None and node.get(leaf) == AUTO:
            node[leaf] = value
            filled[key] = value
    return out, filled


def needed(config: dict[str, Any]) -> list[str]:
    """The dotted keys left "auto" that neither the Trainer's rules fill nor DeepSpeed accepts: the user
    must give them a value."""
    fillable = set(JobSettings().values()) | set(JobSettings().zero3_values())
    return [key for key in auto_keys(config) if key not in fillable]


def auto_keys(config: Any, prefix: str = "") -> list[str]:
    """Every dotted key whose value is "auto"."""
    if not isinstance(config, dict):
        return []
    keys = []
    for key, value in config.items():
        dotted = f"{prefix}{key}"
        if value == AUTO:
            keys.append(dotted)
        elif isinstance(value, dict):
            keys.extend(auto_keys(value, dotted + "."))
    return keys


def describe_filled(filled: dict[str, Any]) -> str:
    return ", ".join(f"{key}={value}" for key, value in filled.items())


def _stage(config: dict[str, Any]) -> int:
    try:
        return int(config.get("zero_optimization", {}).get("stage", 0))
    except (TypeError, ValueError, AttributeError):
        return 0


def _node(config: dict[str, Any], dotted: str) -> tuple[dict[str, Any] | None, str]:
    """The dict holding the last part of `dotted` (None when a section on the way is missing), as the
    Trainer's `find_config_node`: a missing section means nothing to fill."""
    *parents, leaf = dotted.split(".")
    node: Any = config
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
        if node is None:
            return None, leaf
    return (node if isinstance(node, dict) else None), leaf
