"""What a lint rule sees: the config as written, the config with "auto" resolved, the training
arguments, the package versions, and effective values (DeepSpeed defaults applied, types tolerated).

Rules never read files and never raise on odd input: every getter returns None for a missing key or a
value of the wrong type.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lossguard.core.dsconfig import DeepSpeedConfig, as_bool, as_number, dtype_name
from lossguard.core.dsconfig import get_in as _get_in
from lossguard.core.versions import in_range, parse
from lossguard.lint.fsdp import FsdpView
from lossguard.lint.resolve import Resolution, resolve

Path = tuple[str, ...]
_MISSING = object()
__all__ = ["LAUNCH_KEYS", "LintContext", "as_bool", "as_number", "dtype_name", "get_in", "split"]
# Keys that describe the launch, not TrainingArguments: alone they do not make HF defaults apply.
LAUNCH_KEYS = frozenset({"origin", "framework", "launcher", "world_size", "num_nodes", "accelerate_config",
                         "mixed_precision", "script", "zero3_save_16bit_model"})
# TrainingArguments fields that Megatron, pipeline and hand-written DeepSpeed scripts do not take under these
# names: one of them in the arguments means the HF Trainer (or TRL / LLaMA-Factory / axolotl on top of it).
TRAINER_KEYS = frozenset({"per_device_train_batch_size", "output_dir", "num_train_epochs", "logging_steps",
                          "save_strategy", "eval_strategy", "evaluation_strategy", "lr_scheduler_type", "warmup_ratio",
                          "save_steps", "report_to", "logging_nan_inf_filter", "max_grad_norm", "save_total_limit",
                          "gradient_checkpointing_kwargs", "logging_dir", "remove_unused_columns", "overwrite_output_dir"})


def split(path: str | Path) -> Path:
    return tuple(path.split(".")) if isinstance(path, str) else path


def get_in(config: Any, path: str | Path, default: Any = None) -> Any:
    return _get_in(config, split(path), default)


@dataclass
class LintContext:
    raw: dict[str, Any]
    args: dict[str, Any] | None = None
    versions: dict[str, str] = field(default_factory=dict)
    source: str = "<config>"
    options: dict[str, Any] = field(default_factory=dict)
    resolution: Resolution = field(init=False)
    read: set[str] = field(default_factory=set)  # packages whose version a rule looked at (lint/assumed.py)
    fsdp: FsdpView | None = None  # an FSDP run (lint/fsdp.py): no DeepSpeed config, the FSDP rules apply

    def __post_init__(self) -> None:
        if not isinstance(self.raw, dict) or self.fsdp is not None:
            self.raw = {}
        self.resolution = resolve(self.raw, self.args if self.hf_args else None)

    @property
    def engine(self) -> str:
        return "fsdp" if self.fsdp is not None else "deepspeed"

    @property
    def hf_args(self) -> bool:
        """Training arguments are known (not just launch facts such as --world-size)."""
        if not self.args or self.args.get("framework") == "megatron":  # Megatron: only its launch facts count
            return False
        return bool(set(self.args) - LAUNCH_KEYS)

    @property
    def hf_trainer(self) -> bool:
        """The HF Trainer runs this config: a framework built on it, arguments only it takes, or (no arguments)
        "auto" values, which only the HF integration fills. Megatron / pipeline configs have none of these."""
        if self.arg("framework") in ("llamafactory", "axolotl", "megatron"):
            return self.arg("framework") != "megatron"
        if self.hf_args:
            return bool(set(self.args or {}) & TRAINER_KEYS)
        return _has_auto(self.raw)

    @property
    def via_accelerate(self) -> bool:
        """accelerate builds the engine (HF Trainer or `accelerate launch`): it sets steps_per_print to infinity."""
        return self.hf_trainer or self.arg("launcher") == "accelerate"

    @property
    def config(self) -> dict[str, Any]:
        return self.resolution.config

    # --- raw and resolved values -------------------------------------------------------------
    def get(self, path: str | Path, default: Any = None) -> Any:
        return get_in(self.config, path, default)

    def written(self, path: str | Path, default: Any = None) -> Any:
        return get_in(self.raw, path, default)

    def has(self, path: str | Path) -> bool:
        return get_in(self.raw, path, _MISSING) is not _MISSING

    def section(self, name: str) -> dict[str, Any]:
        value = self.config.get(name)
        return value if isinstance(value, dict) else {}

    def arg(self, key: str, default: Any = None) -> Any:
        return self.args.get(key, default) if self.args else default

    # --- versions ----------------------------------------------------------------------------
    def version(self, dist: str) -> str | None:
        self.read.add(dist)
        return self.versions.get(dist)

    def in_range(self, dist: str, low: str | None = None, high: str | None = None) -> bool | None:
        return in_range(self.version(dist), low, high)

    def version_known(self, dist: str) -> bool:
        return parse(self.version(dist)) is not None

    # --- effective values (DeepSpeed defaults applied) ------------------------------------------
    @property
    def ds(self) -> DeepSpeedConfig:
        """The resolved config through the one DeepSpeed-config reader (same parsing as analyze --config)."""
        return DeepSpeedConfig.of(self.config)

    @property
    def zero_stage(self) -> int | None:
        return self.ds.zero_stage

    @property
    def overlap_comm(self) -> bool | None:
        """DeepSpeed default: True for ZeRO-3, False for ZeRO-1/2 (zero/config.py overlap_comm_valid)."""
        return self.ds.overlap_comm

    def precision_enabled(self, kind: str) -> bool | None:
        """fp16/bf16 on? The config's `enabled`; "auto" or absent defer to the training arguments
        (HF fills "auto", accelerate adds the section from --bf16/--fp16); None when unknown."""
        value = self.ds.precision_written(kind)
        if value is not None and value != "auto":
            return as_bool(value)
        launch = self.arg("mixed_precision")  # accelerate's mixed_precision adds the section (or fills "auto")
        if launch is not None and not (self.hf_args and kind in self.args):
            return launch == kind
        if self.hf_args and kind in self.args:
            return bool(self.args[kind])
        if value == "auto":
            return None
        return False if not self.hf_args else bool(self.args.get(kind, False))

    @property
    def bf16(self) -> bool | None:
        return self.precision_enabled("bf16")

    @property
    def fp16(self) -> bool | None:
        return self.precision_enabled("fp16")

    @property
    def comm_dtype(self) -> str | None:
        return self.ds.communication_data_type

    @property
    def world_size(self) -> int | None:
        world = self.arg("world_size")
        return world if isinstance(world, int) and world > 0 else None

    @property
    def multi_rank(self) -> bool:
        """True unless the world size is known to be 1: the ZeRO races need more than one rank."""
        return self.world_size != 1

    def bf16_section_path(self) -> Path:
        return ("bfloat16",) if "bfloat16" in self.raw and "bf16" not in self.raw else ("bf16",)


# Keys only the Trainer fills from its arguments ("auto" in ZeRO-3 sizes is filled for inference too).
_TRAINER_AUTO = ("train_micro_batch_size_per_gpu", "train_batch_size", "gradient_accumulation_steps",
                 "gradient_clipping", "optimizer", "scheduler", "fp16", "bf16")


def _has_auto(config: dict[str, Any]) -> bool:
    return any(_auto_in(config.get(key)) for key in _TRAINER_AUTO)


def _auto_in(value: Any) -> bool:
    if isinstance(value, dict):
        return any(_auto_in(v) for v in value.values())
    return isinstance(value, str) and value.strip().lower() == "auto"
