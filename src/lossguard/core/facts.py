"""What is known about a run besides its numbers: versions, ZeRO settings, precision, world size.

Facts come from the log itself (DeepSpeed banner and config dump), from a DeepSpeed config the user
passes, from `pip freeze` output, or from the live job. Later sources fill gaps; `merge` never lets an
unknown value overwrite a known one. The diagnosis and lint rules read facts, never raw files.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from lossguard.core.dsconfig import DeepSpeedConfig, as_bool, dtype_name

__all__ = ["RunFacts", "dtype_name", "facts_from_ds_config", "facts_from_versions"]


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
    entry_point: str | None = None  # how the live guard was attached: guard, hf, deepspeed
    sharding_engine: str | None = None  # PyTorch FSDP sharding the live run: "fsdp1" or "fsdp2" (its version: torch's)
    fsdp_sharding_strategy: str | None = None  # FSDP1's: FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD, NO_SHARD
    # Where each fact came from, for evidence lines: {"overlap_comm": "ds_config.json"}.
    origin: dict[str, str] = field(default_factory=dict)

    def set(self, name: str, value: Any, origin: str) -> None:
        """Record a fact unless it is unknown (None); the first known value wins, except that a value the
        run states (the log's config dump) replaces a DeepSpeed default the user's config file implied."""
        if value is None:
            return
        if getattr(self, name) is not None and not (_is_default(self.origin.get(name)) and not _is_default(origin)):
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


DEFAULT_MARK = " (DeepSpeed default)"
# Any origin ending so is a default some tool applies (DeepSpeed's, accelerate's): what the run states wins.
_DEFAULT_END = " default)"

Where = Callable[[tuple[str, ...]], "str | None"]  # a config key path -> "file:line", None when unknown


def _is_default(origin: str | None) -> bool:
    return bool(origin) and origin.endswith(_DEFAULT_END)


def facts_from_ds_config(config: dict[str, Any], origin: str, where: Where | None = None) -> RunFacts:
    """Facts a DeepSpeed config states, read by the one config reader (core/dsconfig.py) so that lint and
    analyze agree. DeepSpeed's defaults count where the key is absent (origin marked "default"); "auto" and
    an absent fp16 / bf16 section stay unknown: the HF Trainer decides those. `where(path)` places a written
    key ("ds.json:12") so the diagnosis can cite the line; without it every fact cites `origin`."""
    ds = DeepSpeedConfig.of(config)
    zero = ds.section("zero_optimization")
    facts = RunFacts()

    def put(name: str, value: Any, *path: str, zero_key: bool = False) -> None:
        if zero_key and path[-1] not in zero:
            facts.set(name, value, origin + DEFAULT_MARK)
            return
        facts.set(name, value, (where(path) if where and value is not None else None) or origin)

    def put_zero(name: str, value: Any, key: str) -> None:
        put(name, value, "zero_optimization", key, zero_key=True)

    put_zero("zero_stage", ds.zero_stage, "stage")
    put_zero("overlap_comm", ds.overlap_comm, "overlap_comm")
    put_zero("contiguous_gradients", ds.zero_flag("contiguous_gradients", True), "contiguous_gradients")
    put_zero("use_multi_rank_bucket_allreduce", ds.zero_flag("use_multi_rank_bucket_allreduce", True),
             "use_multi_rank_bucket_allreduce")
    bucket = zero.get("reduce_bucket_size")  # a non-number ("auto") is kept as written, for the report
    put_zero("reduce_bucket_size",
             bucket if bucket is not None and ds.reduce_bucket_size is None else ds.reduce_bucket_size,
             "reduce_bucket_size")
    put_zero("offload_optimizer", ds.offload_optimizer, "offload_optimizer")
    put("communication_data_type", ds.communication_data_type, "communication_data_type")
    bf16 = "bf16" if "bf16" in ds.raw else "bfloat16"  # DeepSpeed's older name, as precision_section reads
    put("bf16", as_bool(ds.precision_written("bf16")), bf16, "enabled")
    put("fp16", as_bool(ds.precision_written("fp16")), "fp16", "enabled")
    put("check_grad_overflow", ds.check_grad_overflow, bf16, "check_grad_overflow")
    if "optimizer" in ds.raw:
        put("optimizer_in_config", True, "optimizer")
    put("gradient_accumulation_steps", ds.gradient_accumulation_steps, "gradient_accumulation_steps")
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
