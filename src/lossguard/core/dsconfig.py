"""One reader for a DeepSpeed config: the same parsing of bools, numbers, "auto" and DeepSpeed's own
defaults for `lossguard lint`, `analyze --config` and the live guard's facts.

Configs in the wild write `"stage": "2"`, `"overlap_comm": "false"` or `"auto"` (the HF Trainer fills it
in). DeepSpeed's pydantic model accepts the first two, so they mean what they say here too; "auto" and
values of the wrong type are unknown (None), never a guess. Readers never raise on odd input.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_DTYPE_NAMES = {
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "torch.float32": "fp32",
    "fp16": "fp16", "float16": "fp16", "half": "fp16", "torch.float16": "fp16",
    "bf16": "bf16", "bfloat16": "bf16", "torch.bfloat16": "bf16",
}


def as_bool(value: Any) -> bool | None:
    """True/False, also written as a string in any case ("false", "True"); None for anything else."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    return None


def as_number(value: Any) -> float | None:
    """An int, float or numeric string ("5e8") as a float; None for bools, "auto" and the rest."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def as_int(value: Any) -> int | None:
    """`as_number` when it is a whole number (2, 2.0, "2"); None otherwise."""
    number = as_number(value)
    return int(number) if number is not None and number.is_integer() else None


def dtype_name(value: Any) -> str | None:
    """fp32 / fp16 / bf16 for any of the spellings DeepSpeed and torch accept; None when unknown."""
    if not isinstance(value, str):
        return None
    return _DTYPE_NAMES.get(value.strip().lower())


def get_in(config: Any, path: tuple[str, ...], default: Any = None) -> Any:
    node = config
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return default
        node = node[key]
    return node


@dataclass(frozen=True, slots=True)
class DeepSpeedConfig:
    """Effective values of a DeepSpeed config dict (DeepSpeed's defaults applied where the key is absent)."""

    raw: dict[str, Any]

    @classmethod
    def of(cls, config: Any) -> DeepSpeedConfig:
        return cls(config if isinstance(config, dict) else {})

    def section(self, name: str) -> dict[str, Any]:
        value = self.raw.get(name)
        return value if isinstance(value, dict) else {}

    @property
    def zero_stage(self) -> int | None:
        """0 without a zero_optimization section (DeepSpeed's default); None for "auto" or nonsense."""
        if "zero_optimization" not in self.raw:
            return 0
        stage = as_int(self.section("zero_optimization").get("stage", 0))
        return stage if stage in (0, 1, 2, 3) else None

    @property
    def overlap_comm(self) -> bool | None:
        """DeepSpeed default: True for ZeRO-3, False for ZeRO-1/2 (zero/config.py overlap_comm_valid)."""
        value = self.section("zero_optimization").get("overlap_comm")
        if value is None:
            return self.zero_stage == 3 if self.zero_stage is not None else None
        return as_bool(value)

    def zero_flag(self, name: str, default: bool) -> bool | None:
        """A boolean zero_optimization key (contiguous_gradients, use_multi_rank_bucket_allreduce, ...)."""
        value = self.section("zero_optimization").get(name)
        return default if value is None else as_bool(value)

    @property
    def reduce_bucket_size(self) -> int | None:
        return as_int(self.section("zero_optimization").get("reduce_bucket_size", 500_000_000))

    @property
    def offload_optimizer(self) -> bool | None:
        offload = self.section("zero_optimization").get("offload_optimizer")
        if offload is None:
            return False
        return offload.get("device") not in (None, "none") if isinstance(offload, dict) else None

    @property
    def communication_data_type(self) -> str | None:
        return dtype_name(self.raw.get("communication_data_type"))

    def precision_section(self, kind: str) -> dict[str, Any]:
        """The fp16 / bf16 section; DeepSpeed also reads bf16 from its older name `bfloat16`."""
        if kind == "bf16" and "bf16" not in self.raw:
            return self.section("bfloat16")
        return self.section(kind)

    def precision_written(self, kind: str) -> Any:
        """`enabled` as written in the fp16 / bf16 section (None when absent, "auto" kept)."""
        return self.precision_section(kind).get("enabled")

    @property
    def check_grad_overflow(self) -> bool | None:
        return as_bool(self.precision_section("bf16").get("check_grad_overflow"))

    @property
    def gradient_accumulation_steps(self) -> int | None:
        return as_int(self.raw.get("gradient_accumulation_steps"))
