"""What is known about a run besides its numbers: versions, ZeRO settings, precision, world size.

Facts come from the log itself (DeepSpeed banner and config dump), from a DeepSpeed config the user
passes, from `pip freeze` output, or from the live job. Later sources fill gaps; `merge` never lets an
unknown value overwrite a known one. The diagnosis and lint rules read facts, never raw files.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


@dataclass(slots=True)
class RunFacts:
    deepspeed_version: str | None = None
    transformers_version: str | None = None
    torch_version: str | None = None
    peft_version: str | None = None
    accelerate_version: str | None = None
    zero_stage: int | None = None
    overlap_comm: bool | None = None
    contiguous_gradients: bool | None = None
    use_multi_rank_bucket_allreduce: bool | None = None
    reduce_bucket_size: Any = None
    communication_data_type: str | None = None  # "fp32", "bf16", "fp16" or None (DeepSpeed's default)
    bf16: bool | None = None
    fp16: bool | None = None
    check_grad_overflow: bool | None = None
    optimizer_in_config: bool | None = None
    offload_optimizer: bool | None = None
    world_size: int | None = None
    num_nodes: int | None = None
    gradient_accumulation_steps: int | None = None
    gradient_checkpointing: bool | None = None
    lora: bool | None = None
    # Where each fact came from, for evidence lines: {"overlap_comm": "ds_config.json"}.
    origin: dict[str, str] = field(default_factory=dict)

    def set(self, name: str, value: Any, origin: str) -> None:
        """Record a fact unless it is unknown (None); the first known value wins."""
        if value is None or getattr(self, name) is not None:
            return
        setattr(self, name, value)
        self.origin[name] = origin

    def merge(self, other: RunFacts) -> None:
        for f in fields(self):
            if f.name != "origin":
                self.set(f.name, getattr(other, f.name), other.origin.get(f.name, "?"))

    def known(self) -> dict[str, Any]:
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name != "origin" and getattr(self, f.name) is not None
        }


def _as_bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return None


_DTYPE_NAMES = {
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "torch.float32": "fp32",
    "fp16": "fp16", "float16": "fp16", "half": "fp16", "torch.float16": "fp16",
    "bf16": "bf16", "bfloat16": "bf16", "torch.bfloat16": "bf16",
}


def dtype_name(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    return _DTYPE_NAMES.get(value.strip().lower())


def facts_from_ds_config(config: dict[str, Any], origin: str) -> RunFacts:
    """Facts a DeepSpeed config states. "auto" values stay unknown (None)."""
    facts = RunFacts()
    zero = config.get("zero_optimization") or {}
    if not isinstance(zero, dict):
        zero = {}
    stage = zero.get("stage")
    facts.set("zero_stage", stage if isinstance(stage, int) else None, origin)
    facts.set("overlap_comm", _as_bool(zero.get("overlap_comm")), origin)
    facts.set("contiguous_gradients", _as_bool(zero.get("contiguous_gradients")), origin)
    facts.set("use_multi_rank_bucket_allreduce", _as_bool(zero.get("use_multi_rank_bucket_allreduce")), origin)
    facts.set("reduce_bucket_size", zero.get("reduce_bucket_size"), origin)
    offload = zero.get("offload_optimizer")
    if isinstance(offload, dict):
        facts.set("offload_optimizer", offload.get("device") not in (None, "none"), origin)
    facts.set("communication_data_type", dtype_name(config.get("communication_data_type")), origin)
    bf16 = config.get("bf16") or config.get("bfloat16") or {}
    fp16 = config.get("fp16") or {}
    if isinstance(bf16, dict):
        facts.set("bf16", _as_bool(bf16.get("enabled")), origin)
        facts.set("check_grad_overflow", _as_bool(bf16.get("check_grad_overflow")), origin)
    if isinstance(fp16, dict):
        facts.set("fp16", _as_bool(fp16.get("enabled")), origin)
    if "optimizer" in config:
        facts.set("optimizer_in_config", True, origin)
    ga = config.get("gradient_accumulation_steps")
    facts.set("gradient_accumulation_steps", ga if isinstance(ga, int) else None, origin)
    return facts


# pip distribution name -> RunFacts field
_VERSION_FIELDS = {
    "deepspeed": "deepspeed_version",
    "transformers": "transformers_version",
    "torch": "torch_version",
    "peft": "peft_version",
    "accelerate": "accelerate_version",
}


def facts_from_versions(versions: dict[str, str], origin: str) -> RunFacts:
    facts = RunFacts()
    for dist, version in versions.items():
        name = _VERSION_FIELDS.get(dist.lower().replace("_", "-"))
        if name:
            facts.set(name, version, origin)
    return facts
