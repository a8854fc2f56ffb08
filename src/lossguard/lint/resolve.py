"""Resolve `"auto"` the way the HF DeepSpeed integration does, and record what could not be resolved.

Mirrors transformers `integrations/deepspeed.py`: `HfTrainerDeepSpeedConfig.trainer_config_process`
(batch sizes, clipping, optimizer and scheduler params, fp16/bf16) and `trainer_config_finalize`
(hidden-size based buckets, scheduler step counts). Only keys present as "auto" are filled; keys the
user set to a value that differs from the arguments are recorded as mismatches (HF refuses to start).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from lossguard.lint.args import HF_DEFAULTS, hidden_size

Path = tuple[str, ...]


@dataclass(slots=True)
class Resolution:
    config: dict[str, Any]
    filled: dict[Path, tuple[Any, str]] = field(default_factory=dict)  # path -> (value, from what)
    unresolved: dict[Path, str] = field(default_factory=dict)  # path -> why not
    mismatches: dict[Path, tuple[Any, Any, str]] = field(default_factory=dict)  # path -> (ds, hf, hf key)


def _node(config: dict[str, Any], path: Path) -> tuple[dict[str, Any] | None, str]:
    node: Any = config
    for key in path[:-1]:
        node = node.get(key) if isinstance(node, dict) else None
    return (node if isinstance(node, dict) else None), path[-1]


def auto_paths(config: Any, prefix: Path = ()) -> list[Path]:
    out: list[Path] = []
    if isinstance(config, dict):
        for key, value in config.items():
            if value == "auto":
                out.append((*prefix, str(key)))
            elif isinstance(value, dict):
                out.extend(auto_paths(value, (*prefix, str(key))))
    return out


def _arg(args: dict[str, Any], key: str) -> Any:
    return args.get(key, HF_DEFAULTS.get(key))


def resolve(config: dict[str, Any], args: dict[str, Any] | None) -> Resolution:
    res = Resolution(config=copy.deepcopy(config))
    autos = auto_paths(config)
    if args is None:
        for path in autos:
            res.unresolved[path] = "no training arguments given (only the HF Trainer / accelerate fill \"auto\")"
        return res
    world = args.get("world_size")
    micro, ga = _arg(args, "per_device_train_batch_size"), _arg(args, "gradient_accumulation_steps")
    lr = _arg(args, "learning_rate")
    matches: list[tuple[Path, Any, str, bool]] = [
        (("train_micro_batch_size_per_gpu",), micro, "per_device_train_batch_size", True),
        (("gradient_accumulation_steps",), ga, "gradient_accumulation_steps", True),
        (("train_batch_size",), world * micro * ga if world else None, "train_batch_size (calculated)", True),
        (("gradient_clipping",), _arg(args, "max_grad_norm"), "max_grad_norm", True),
        (("optimizer", "params", "lr"), lr, "learning_rate", True),
        (("optimizer", "params", "betas"), [_arg(args, "adam_beta1"), _arg(args, "adam_beta2")], "adam_beta1+adam_beta2", True),
        (("optimizer", "params", "eps"), _arg(args, "adam_epsilon"), "adam_epsilon", True),
        (("optimizer", "params", "weight_decay"), _arg(args, "weight_decay"), "weight_decay", True),
        (("scheduler", "params", "warmup_min_lr"), 0, "(not a trainer argument)", False),
        (("scheduler", "params", "warmup_max_lr"), lr, "learning_rate", True),
        (("fp16", "enabled"), bool(_arg(args, "fp16") or args.get("fp16_full_eval")), "fp16|fp16_full_eval", True),
        (("bf16", "enabled"), bool(_arg(args, "bf16") or args.get("bf16_full_eval")), "bf16|bf16_full_eval", True),
    ]
    for path, hf_value, hf_key, must_match in matches:
        _fill(res, path, hf_value, hf_key, must_match)
    _finalize(res, args)
    return res


def _fill(res: Resolution, path: Path, hf_value: Any, hf_key: str, must_match: bool) -> None:
    node, key = _node(res.config, path)
    if node is None or key not in node:
        return
    if node[key] == "auto":
        if hf_value is None:
            res.unresolved[path] = (f"needs {hf_key}, which is unknown here" + ("" if "calculated" not in hf_key else ": pass --world-size or a launcher option such as --num_gpus"))
            return
        node[key] = hf_value
        res.filled[path] = (hf_value, hf_key)
        return
    ds_value = node[key]
    if must_match and hf_value is not None and ds_value is not None and not _same(ds_value, hf_value):
        res.mismatches[path] = (ds_value, hf_value, hf_key)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _finalize(res: Resolution, args: dict[str, Any]) -> None:
    hidden, how = hidden_size(args)
    zero = res.config.get("zero_optimization")
    stage = zero.get("stage") if isinstance(zero, dict) else None
    sized = [(("zero_optimization", "reduce_bucket_size"), lambda h: h * h)]
    if stage == 3:
        sized += [(("zero_optimization", "stage3_prefetch_bucket_size"), lambda h: int(0.9 * h * h)),
                  (("zero_optimization", "stage3_param_persistence_threshold"), lambda h: 10 * h)]
    for path, rule in sized:
        node, key = _node(res.config, path)
        if node is None or node.get(key) != "auto":
            continue
        if hidden is None:
            res.unresolved[path] = "needs the model's hidden_size (pass model_name_or_path pointing at a local model, or hidden_size)"
        else:
            node[key] = rule(hidden)
            res.filled[path] = (node[key], f"hidden_size {hidden} ({how})")
    # Step counts need the dataset length; the Trainer fills them at runtime.
    for path in auto_paths(res.config):
        res.unresolved.setdefault(path, "filled by the Trainer at runtime from the dataset length"
                                  if path[0] == "scheduler" else "HF does not resolve this key")
