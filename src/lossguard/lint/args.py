"""Training arguments from wherever the user has them: a JSON/YAML file (HF TrainingArguments dump,
LLaMA-Factory or axolotl YAML), a launch command line, or `training_args.bin` (pickle, opt-in only).

Everything becomes one flat dict with HF TrainingArguments names plus a few launch facts
(`world_size`, `num_nodes`, `lora`, `hidden_size`, `framework`). Values the user did not give are
absent; `HF_DEFAULTS` holds what the Trainer would use instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
from typing import Any

from lossguard.lint.document import ConfigError, read_document

# TrainingArguments defaults the HF DeepSpeed integration fills "auto" from.
HF_DEFAULTS: dict[str, Any] = {
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 1,
    "max_grad_norm": 1.0,
    "learning_rate": 5e-5,
    "adam_beta1": 0.9,
    "adam_beta2": 0.999,
    "adam_epsilon": 1e-8,
    "weight_decay": 0.0,
    "fp16": False,
    "bf16": False,
    "logging_nan_inf_filter": True,
    "warmup_steps": 0,
    "warmup_ratio": 0.0,
    "max_steps": -1,
    "gradient_checkpointing": False,
}

_BOOL_KEYS = {"fp16", "bf16", "logging_nan_inf_filter", "gradient_checkpointing", "lora", "fp16_full_eval",
              "bf16_full_eval", "lora_enable", "use_lora", "use_peft", "use_peft_lora"}
_INT_KEYS = {"per_device_train_batch_size", "gradient_accumulation_steps", "warmup_steps", "max_steps",
             "world_size", "num_nodes", "hidden_size"}
_FLOAT_KEYS = {"max_grad_norm", "learning_rate", "adam_beta1", "adam_beta2", "adam_epsilon", "weight_decay",
               "warmup_ratio", "num_train_epochs"}

# Framework key -> HF name.
_AXOLOTL_KEYS = {"base_model": "model_name_or_path", "micro_batch_size": "per_device_train_batch_size",
                 "num_epochs": "num_train_epochs"}


class ArgsError(ValueError):
    pass


def _to_bool(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return bool(value)
    if isinstance(value, str):
        low = value.strip().lower()
        if low in ("true", "t", "yes", "y", "1"):
            return True
        if low in ("false", "f", "no", "n", "0"):
            return False
    return None


def _to_number(value: Any, kind: type) -> Any:
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    if kind is int:
        return int(number) if number == int(number) else None
    return number


def normalize(raw: dict[str, Any], origin: str) -> dict[str, Any]:
    """Map framework keys to HF names and coerce types; unknown keys pass through unchanged."""
    out: dict[str, Any] = {"origin": origin}
    if isinstance(raw.get("training_args"), dict):  # GLM-4 finetune_demo YAML nests the HF arguments
        peft = raw.get("peft_config")
        raw = {**raw, **raw["training_args"]}
        if isinstance(peft, dict) and str(peft.get("peft_type", "")).upper() == "LORA":
            raw.setdefault("lora", True)
    framework = "hf"
    if any(k in raw for k in ("finetuning_type", "template", "cutoff_len")):
        framework = "llamafactory"
    elif any(k in raw for k in ("base_model", "micro_batch_size", "adapter", "datasets")):
        framework = "axolotl"
    out["framework"] = raw.get("framework", framework)
    for key, value in raw.items():
        key = _AXOLOTL_KEYS.get(key, key).replace("-", "_")
        if key in _BOOL_KEYS:
            value = _to_bool(value)
        elif key in _INT_KEYS:
            value = _to_number(value, int)
        elif key in _FLOAT_KEYS:
            value = _to_number(value, float)
        if value is not None:
            out[key] = value
    lora = out.get("lora")
    if lora is None:
        if framework == "llamafactory":
            lora = str(raw.get("finetuning_type", "")).lower() == "lora" or None
        elif framework == "axolotl":
            lora = str(raw.get("adapter", "")).lower() in ("lora", "qlora") or None
        if any(out.get(k) for k in ("lora_enable", "use_lora", "use_peft", "use_peft_lora")):
            lora = True
        if lora is not None:
            out["lora"] = lora
    kwargs = out.get("gradient_checkpointing_kwargs")
    if isinstance(kwargs, str):
        with contextlib.suppress(json.JSONDecodeError):
            out["gradient_checkpointing_kwargs"] = json.loads(kwargs)
    return out


def load_args_file(path: str, trust_pickle: bool = False) -> dict[str, Any]:
    if path.endswith(".bin") or path.endswith(".pkl"):
        return _load_pickle(path, trust_pickle)
    try:
        doc = read_document(path)
    except ConfigError as exc:
        raise ArgsError(str(exc).replace("DeepSpeed keys", "training arguments")) from None
    return normalize(doc.data, path)


def _load_pickle(path: str, trust_pickle: bool) -> dict[str, Any]:
    if not trust_pickle:
        raise ArgsError(f"{path}: training_args.bin is a pickle and loading it can run code; pass --trust-pickle "
                        "if you trust it, or save the arguments as JSON (args.to_json_string())")
    if not os.path.isfile(path):
        raise ArgsError(f"{path}: no such file; check the path")
    try:
        import torch  # only on explicit request: unpickling TrainingArguments needs transformers anyway

        obj = torch.load(path, weights_only=False)
    except Exception as exc:
        raise ArgsError(f"{path}: cannot unpickle ({type(exc).__name__}: {exc}); save the arguments as JSON instead") from None
    raw = obj.to_dict() if hasattr(obj, "to_dict") else dict(vars(obj))
    return normalize(raw, path)


# Launcher options that take a value (everything else starting with -- is a flag).
_LAUNCHER_VALUE_OPTS = {
    "num_gpus", "num_nodes", "include", "exclude", "hostfile", "master_port", "master_addr", "launcher",
    "node_rank", "launcher_args", "nproc_per_node", "nnodes", "rdzv_backend", "rdzv_endpoint", "rdzv_id",
    "rdzv_conf", "max_restarts", "monitor_interval", "start_method", "role", "log_dir", "redirects", "tee",
    "local_addr", "num_processes", "num_machines", "machine_rank", "main_process_ip", "main_process_port",
    "config_file", "mixed_precision", "deepspeed_config_file", "zero_stage", "gradient_accumulation_steps",
    "dynamo_backend", "gpu_ids", "num_cpu_threads_per_process", "deepspeed_multinode_launcher",
    "offload_optimizer_device", "offload_param_device", "gradient_clipping", "module", "elastic_training",
}
_LAUNCHERS = {"deepspeed", "torchrun", "accelerate"}
# Megatron(-DeepSpeed) / GPT-NeoX script arguments no HF script takes: a command with one runs its own trainer.
_MEGATRON_ARGS = frozenset({"tensor_model_parallel_size", "pipeline_model_parallel_size", "global_batch_size",
                            "train_iters", "num_layers", "seq_length", "micro_batch_size", "lr_decay_style"})


def _option(token: str) -> tuple[str, str | None]:
    name, eq, value = token.lstrip("-").partition("=")
    return name.replace("-", "_"), (value if eq else None)


def _launcher_opts(tokens: list[str], i: int) -> tuple[dict[str, str], int]:
    """Parse launcher options from tokens[i:] up to the script; returns (opts, index of the script)."""
    opts: dict[str, str] = {}
    while i < len(tokens) and tokens[i].startswith("-"):
        name, value = _option(tokens[i])
        i += 1
        if value is None and name in _LAUNCHER_VALUE_OPTS and i < len(tokens):
            value = tokens[i]
            i += 1
        opts[name] = value if value is not None else "true"
    return opts, i


def _script_args(tokens: list[str]) -> dict[str, Any]:
    raw: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if not token.startswith("--"):
            continue
        name, value = _option(token)
        if value is None:
            if i < len(tokens) and not tokens[i].startswith("--"):
                value = tokens[i]
                i += 1
            else:
                value = "true"  # bare flag: `--bf16`
        raw[name] = value
    return raw


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    text = text.split(":")[-1]  # torchrun --nnodes 1:4 -> the maximum
    return int(text) if text.isdigit() else None


def _world_from(launcher: str, opts: dict[str, str], env: dict[str, str]) -> tuple[int | None, int | None]:
    """(world size, nodes) from launcher options; None when the launcher uses every visible GPU."""
    if launcher == "deepspeed":
        nodes = _int(opts.get("num_nodes"))
        if "include" in opts:
            hosts = [h for h in opts["include"].split("@") if h]
            count = sum(len(h.split(":", 1)[1].split(",")) if ":" in h else 0 for h in hosts)
            return (count or None), len(hosts)
        per_node = _int(opts.get("num_gpus"))
        if per_node is None:
            return None, nodes
        return per_node * (nodes or 1), nodes or 1
    if launcher == "torchrun":
        per_node = _int(opts.get("nproc_per_node") or env.get("NPROC_PER_NODE"))
        nodes = _int(opts.get("nnodes")) or 1
        return (per_node * nodes if per_node else None), nodes
    if launcher == "accelerate":
        return _int(opts.get("num_processes")), _int(opts.get("num_machines")) or None
    return 1, 1  # plain `python train.py`: one process


def parse_command(cmd: str, trust_pickle: bool = False) -> dict[str, Any]:
    """Training arguments and world size from a launch command line."""
    try:
        tokens = shlex.split(cmd.replace("\\\n", " "), comments=True)
    except ValueError as exc:
        raise ArgsError(f"--cmd: cannot split the command line ({exc}); check the quotes") from None
    env: dict[str, str] = {}
    while tokens and "=" in tokens[0] and not tokens[0].startswith("-"):
        key, _, value = tokens.pop(0).partition("=")
        env[key] = value
    if not tokens:
        raise ArgsError("--cmd: empty command; pass the launch command, e.g. --cmd 'deepspeed train.py --deepspeed ds.json'")
    prog = os.path.basename(tokens[0])
    i = 1
    launcher = "python"
    if prog in ("python", "python3") or prog.startswith("python3."):
        while i < len(tokens) and tokens[i].startswith("-") and tokens[i] != "-m":
            i += 1
        if i + 1 < len(tokens) and tokens[i] == "-m":
            module = tokens[i + 1]
            i += 2
            if module in ("torch.distributed.run", "torch.distributed.launch"):
                launcher = "torchrun"
            elif module.startswith("deepspeed.launcher"):
                launcher = "deepspeed"
            elif module == "accelerate.commands.launch":
                launcher = "accelerate"
    elif prog in _LAUNCHERS:
        launcher = prog
        if prog == "accelerate" and i < len(tokens) and tokens[i] == "launch":
            i += 1
    elif prog in ("llamafactory-cli", "axolotl"):
        launcher = prog
    opts: dict[str, str] = {}
    if launcher in _LAUNCHERS:
        opts, i = _launcher_opts(tokens, i)
    rest = tokens[i:]
    raw: dict[str, Any] = {}
    yaml_cfg = next((t for t in rest if t.endswith((".yaml", ".yml")) and not t.startswith("-")), None)
    if yaml_cfg and launcher in ("llamafactory-cli", "axolotl", "accelerate", "torchrun", "deepspeed", "python"):
        if os.path.isfile(yaml_cfg):
            raw.update(load_args_file(yaml_cfg))
        for token in rest:  # llamafactory-cli train cfg.yaml key=value overrides
            if "=" in token and not token.startswith("-"):
                key, _, value = token.partition("=")
                raw[key] = value
    script_args = _script_args(rest[1:] if rest else [])
    if not yaml_cfg and _MEGATRON_ARGS & set(script_args):
        raw["framework"] = "megatron"  # its own trainer: HF defaults and HF-only rules do not apply
    raw.update(script_args)
    if launcher == "accelerate":
        if opts.get("mixed_precision") in ("bf16", "fp16"):
            raw.setdefault(opts["mixed_precision"], "true")
        if "deepspeed_config_file" in opts:
            raw.setdefault("deepspeed", opts["deepspeed_config_file"])
    world, nodes = _world_from(launcher if launcher in _LAUNCHERS else "python", opts, env)
    if launcher in ("llamafactory-cli", "axolotl"):
        world, nodes = None, None
    if world is not None:
        raw.setdefault("world_size", world)
    if nodes is not None:
        raw.setdefault("num_nodes", nodes)
    out = normalize(raw, "--cmd")
    if raw.get("framework"):
        out["framework"] = raw["framework"]
    out["launcher"] = launcher
    if rest and rest[0].endswith(".py"):
        out["script"] = rest[0]  # HFA202 reads it for enable_input_require_grads()
    if launcher == "accelerate" and opts.get("config_file"):
        out["accelerate_config"] = opts["config_file"]  # lint follows it to the DeepSpeed config (lint/routes.py)
    return out


# Hidden sizes by model-name pattern, for `reduce_bucket_size: "auto"` messages only (an estimate).
_HIDDEN_BY_NAME = (
    ("70b", 8192), ("72b", 8192), ("34b", 7168), ("32b", 5120), ("14b", 5120), ("13b", 5120), ("9b", 4096),
    ("8b", 4096), ("7b", 4096), ("3b", 2560), ("1.8b", 2048), ("1.5b", 1536), ("0.5b", 896),
)


def hidden_size(args: dict[str, Any] | None) -> tuple[int | None, str]:
    """(hidden size, how it was found) from the args, a local model config.json, or the model name."""
    if not args:
        return None, ""
    if isinstance(args.get("hidden_size"), int):
        return args["hidden_size"], "training arguments"
    model = args.get("model_name_or_path")
    if not isinstance(model, str):
        return None, ""
    config_path = os.path.join(model, "config.json")
    if os.path.isfile(config_path):
        try:
            with open(config_path, encoding="utf-8") as fh:
                cfg = json.load(fh)
        except (OSError, ValueError):
            cfg = {}
        for node in (cfg, cfg.get("text_config") or {}, cfg.get("llm_config") or {}):
            if isinstance(node.get("hidden_size"), int):
                return node["hidden_size"], config_path
            if isinstance(node.get("hidden_sizes"), list) and node["hidden_sizes"]:
                return max(node["hidden_sizes"]), config_path
    low = model.lower()
    for pattern, size in _HIDDEN_BY_NAME:
        if f"-{pattern}" in low or f"_{pattern}" in low or low.endswith(pattern):
            return size, f"estimated from the model name {model!r}"
    return None, ""
