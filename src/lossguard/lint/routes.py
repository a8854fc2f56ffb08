"""Every route from what the user points lint at to the DeepSpeed config the run will use.

- a DeepSpeed config (JSON / YAML) is itself;
- an accelerate YAML (`distributed_type: DEEPSPEED`, a `deepspeed_config` mapping) either names a JSON in
  `deepspeed_config_file` (followed relative to the YAML, as `accelerate launch` run from its folder would)
  or is turned into the config accelerate's `DeepSpeedPlugin.__post_init__` builds from its keys;
  `mixed_precision` and `num_processes` x `num_machines` become launch facts;
- a LLaMA-Factory / axolotl / HF arguments YAML with `deepspeed: PATH` (or an inline mapping) is followed,
  and the YAML itself becomes the training arguments;
- `--deepspeed FILE|'{...}'` or `accelerate launch --config_file FILE` inside `--cmd` name the config when
  CONFIG is not given.
A file where no DeepSpeed key is recognised is reported as such (`Route.recognised` False), never as clean.

`open_route(path)` is the one entry every verb uses (`lint CONFIG`, `analyze --config`, `probe CONFIG`), so a
YAML means the same DeepSpeed config to all three; `lint/run_config.py` turns a route into run facts
(analyze) or the dict a job gets (probe).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from lossguard.lint.document import ConfigError, Document, parse_text, read_document

__all__ = ["ACCELERATE_KEYS", "Route", "accelerate_launch", "check_recognised", "follow", "from_command",
           "open_route", "recognised_keys"]

# Top-level keys of DeepSpeed's config (runtime/constants.py and the feature sections) that lint knows.
DEEPSPEED_KEYS = frozenset({
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "zero_optimization",
    "fp16", "bf16", "bfloat16", "amp", "optimizer", "scheduler", "gradient_clipping", "steps_per_print",
    "wall_clock_breakdown", "zero_allow_untested_optimizer", "activation_checkpointing", "flops_profiler",
    "communication_data_type", "prescale_gradients", "gradient_predivide_factor", "sparse_gradients",
    "tensorboard", "wandb", "csv_monitor", "comms_logger", "data_efficiency", "curriculum_learning",
    "compression_training", "pipeline", "checkpoint", "data_types", "aio", "elasticity", "autotuning",
    "sparse_attention", "dump_state", "memory_breakdown", "zero_force_ds_cpu_optimizer", "tensor_parallel",
    "sequence_parallel_size", "seq_parallel_communication_data_type", "torch_autocast", "compile",
    "mics_shard_size", "mics_hierarchical_params_gather", "moe", "gradient_accumulation_dtype", "hybrid_engine",
    "nebula", "weight_quantization", "fp8", "zenflow", "timers", "eigenvalue", "progressive_layer_drop",
    "quantize_training", "disable_allgather", "use_data_before_expert_parallelism", "dataloader_drop_last",
    "graph_harvesting", "use_node_local_storage", "load_universal_checkpoint", "train_batch_size_per_gpu",
})
# The DeepSpeed key each accelerate `deepspeed_config` key becomes (`_plugin_config`): a value read from the
# config accelerate builds is cited at the YAML line the user wrote.
ACCELERATE_KEYS: dict[tuple[str, ...], str] = {
    ("zero_optimization", "stage"): "zero_stage",
    ("zero_optimization", "offload_optimizer"): "offload_optimizer_device",
    ("zero_optimization", "offload_optimizer", "device"): "offload_optimizer_device",
    ("zero_optimization", "offload_param"): "offload_param_device",
    ("zero_optimization", "offload_param", "device"): "offload_param_device",
    ("zero_optimization", "stage3_gather_16bit_weights_on_model_save"): "zero3_save_16bit_model",
    ("gradient_accumulation_steps",): "gradient_accumulation_steps",
    ("gradient_clipping",): "gradient_clipping",
}


@dataclass
class Route:
    doc: Document  # the DeepSpeed config the run uses (synthesized for accelerate keys: source names the YAML)
    how: str  # one line: which route was followed
    launch: dict[str, Any] = field(default_factory=dict)  # facts the route adds: world_size, bf16, fp16
    args_file: str | None = None  # the YAML holds training arguments too (LLaMA-Factory / axolotl)
    synthesized: bool = False  # no file to fix: accelerate builds this config from YAML keys
    recognised: bool = True
    unread: str | None = None  # the file the route names could not be read: why (lint checks what it has)
    shown: str = ""  # the file findings are reported against (the YAML for a synthesized config)
    via: Document | None = None  # the accelerate / training YAML that named or built `doc`
    fsdp: str | None = None  # an FSDP config of this kind (lint/fsdp.py): no DeepSpeed config behind it

    def __post_init__(self) -> None:
        self.shown = self.shown or self.doc.source


def recognised_keys(data: dict[str, Any]) -> list[str]:
    return [k for k in data if k in DEEPSPEED_KEYS]


def follow(doc: Document) -> Route:
    """The DeepSpeed config behind `doc`. Raises ConfigError when a named file cannot be read."""
    data = doc.data
    if isinstance(data.get("deepspeed_config"), dict) or data.get("distributed_type") == "DEEPSPEED":
        return _accelerate(doc)
    fsdp = _fsdp_kind(data)
    if fsdp:
        return _fsdp(doc, fsdp)
    target = data.get("deepspeed")
    if target is not None:  # not a DeepSpeed key: training arguments that name the config (they may share GA)
        return _args_yaml(doc, target)
    return Route(doc=doc, how="DeepSpeed config", recognised=bool(recognised_keys(data)))


def _fsdp_kind(data: dict[str, Any]) -> str | None:
    from lossguard.lint.fsdp import kind_of

    return None if data.get("deepspeed") else kind_of(data)


def _fsdp(doc: Document, kind: str) -> Route:
    """An FSDP config: linted by the FSDP rules; a training YAML is the Trainer's arguments too."""
    launch = _accelerate_launch(doc.data) if kind == "accelerate" else {}
    from lossguard.lint.args import normalize

    args_file = doc.source if kind == "trainer" and normalize(doc.data, doc.source).get("framework") != "hf" else None
    names = {"accelerate": "accelerate YAML", "trainer": "training arguments", "trainer-fsdp-config":
             "Trainer --fsdp_config file", "torchtitan": "torchtitan TOML", "torchtune": "torchtune recipe",
             "composer": "llm-foundry (Composer) YAML", "verl": "verl FSDP engine config"}
    return Route(doc=doc, how=f"FSDP config: {names.get(kind, kind)} {doc.source}", launch=launch,
                 args_file=args_file, fsdp=kind)


def _accelerate(doc: Document) -> Route:
    data = doc.data
    section = data.get("deepspeed_config") if isinstance(data.get("deepspeed_config"), dict) else {}
    launch = _accelerate_launch(data)
    file = section.get("deepspeed_config_file")
    if isinstance(file, str) and file.strip() and file != "none":
        key = ("deepspeed_config", "deepspeed_config_file")
        try:
            inner = _read_named(doc, key, file)
        except ConfigError as exc:
            route = _accelerate_keys(doc, {}, launch)
            route.unread = str(exc)
            return route
        return Route(doc=inner, how=f"accelerate YAML {doc.source} -> deepspeed_config_file {inner.source}",
                     launch=launch, via=doc)
    return _accelerate_keys(doc, section, launch)


def _accelerate_keys(doc: Document, section: dict[str, Any], launch: dict[str, Any]) -> Route:
    built = _plugin_config(section)
    text = json.dumps(built, indent=2)
    synth = parse_text(text, f"{doc.source} (deepspeed_config keys)", "json")
    return Route(doc=synth, how=f"accelerate YAML {doc.source}: DeepSpeed config built from its deepspeed_config keys",
                 launch=launch, synthesized=True, recognised=True, shown=doc.source, via=doc)


def _accelerate_launch(data: dict[str, Any]) -> dict[str, Any]:
    launch: dict[str, Any] = {}
    section = data.get("deepspeed_config") if isinstance(data.get("deepspeed_config"), dict) else {}
    if isinstance(section.get("zero3_save_16bit_model"), bool):  # fills stage3_gather_16bit_..._save: "auto"
        launch["zero3_save_16bit_model"] = section["zero3_save_16bit_model"]
    procs, machines = data.get("num_processes"), data.get("num_machines") or 1
    if isinstance(procs, int) and procs > 0 and isinstance(machines, int) and machines > 0:
        # accelerate's num_processes is the total over all machines
        launch["world_size"] = procs
        if machines > 1:
            launch["num_nodes"] = machines
    precision = str(data.get("mixed_precision", "")).strip().lower()
    if precision in ("bf16", "fp16", "fp8", "no"):
        launch["mixed_precision"] = "bf16" if precision == "fp8" else precision  # fp8 keeps bf16 autocast
    return launch


def _plugin_config(section: dict[str, Any]) -> dict[str, Any]:
    """accelerate's `DeepSpeedPlugin.__post_init__` (no config file): unset keys take its env defaults."""
    ga = section.get("gradient_accumulation_steps", "auto")
    stage = section.get("zero_stage", 2)
    opt_dev = section.get("offload_optimizer_device", "none")
    par_dev = section.get("offload_param_device", "none")
    config: dict[str, Any] = {
        "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": ga,
        "zero_optimization": {
            "stage": stage,
            "offload_optimizer": {"device": opt_dev},
            "offload_param": {"device": par_dev},
            "stage3_gather_16bit_weights_on_model_save": bool(section.get("zero3_save_16bit_model", False)),
        },
    }
    clipping = section.get("gradient_clipping", "auto")
    if clipping:
        config["gradient_clipping"] = clipping
    return config


def _args_yaml(doc: Document, target: Any) -> Route:
    if isinstance(target, dict):
        inner = parse_text(json.dumps(target, indent=2), f"{doc.source} (deepspeed mapping)", "json")
        return Route(doc=inner, how=f"training YAML {doc.source}: inline deepspeed mapping", args_file=doc.source,
                     synthesized=True, shown=doc.source, via=doc)
    if not isinstance(target, str) or not target.strip():
        return Route(doc=doc, how="training arguments without a DeepSpeed config", recognised=False)
    inner = _read_named(doc, ("deepspeed",), target)
    return Route(doc=inner, how=f"training YAML {doc.source} -> deepspeed {inner.source}", args_file=doc.source,
                 via=doc)


def accelerate_launch(path: str) -> dict[str, Any]:
    """num_processes / mixed_precision of the accelerate YAML a launch command names (CONFIG given apart)."""
    return _accelerate_launch(_read_file(path, "--cmd: accelerate launch --config_file").data)


def from_command(args: dict[str, Any] | None, accelerate_config: str | None) -> Route | None:
    """The config a launch command names: `accelerate launch --config_file`, else `--deepspeed FILE|'{...}'`."""
    if accelerate_config:
        return follow(_read_file(accelerate_config, "--cmd: accelerate launch --config_file"))
    target = (args or {}).get("deepspeed")
    if isinstance(target, dict) or (isinstance(target, str) and target.lstrip().startswith("{")):
        text = target if isinstance(target, str) else json.dumps(target)
        inner = parse_text(text, "--cmd --deepspeed (inline)", "json")
        return Route(doc=inner, how="--cmd: inline --deepspeed dict", synthesized=True)
    if isinstance(target, str) and target.strip():
        return Route(doc=_read_file(target, "--cmd: --deepspeed"), how=f"--cmd: --deepspeed {target}")
    return None


def open_route(path: str, *, allow_unread: bool = False, allow_fsdp: bool = False) -> Route:
    """The DeepSpeed config a run uses, from the file the user points at (a DeepSpeed JSON/YAML, an accelerate
    YAML, a LLaMA-Factory / axolotl YAML). Raises ConfigError (one line: file, key, next step) when it
    cannot be read, names a file that cannot be read, or holds no DeepSpeed key. `allow_unread` keeps an
    accelerate YAML whose `deepspeed_config_file` is unreadable (lint checks its other keys and says so)."""
    route = follow(read_document(path))
    if route.fsdp and not allow_fsdp:
        raise ConfigError(f"{path}: an FSDP config ({route.how}); this command reads DeepSpeed configs only "
                          "(`lossguard lint` checks FSDP configs)")
    if route.unread and not allow_unread:
        raise ConfigError(route.unread)
    check_recognised(route, path)
    return route


def check_recognised(route: Route, shown: str) -> None:
    """A file with no DeepSpeed key would read as ZeRO stage 0 with every default: refuse it instead."""
    if route.recognised:
        return
    keys = ", ".join(list(route.doc.data)[:6]) or "none"
    raise ConfigError(f"{shown}: no DeepSpeed key recognised (top-level keys: {keys}); pass the DeepSpeed config, "
                      f"or the accelerate / LLaMA-Factory / axolotl YAML that names it (known keys include "
                      f"{', '.join(sorted(DEEPSPEED_KEYS)[:4])}, ...)")


def _relative(source: str, path: str) -> str:
    path = os.path.expanduser(path)
    return path if os.path.isabs(path) else os.path.normpath(os.path.join(os.path.dirname(source), path))


def _read_named(doc: Document, key: tuple[str, ...], written: str) -> Document:
    """The file a YAML key names. accelerate opens it from the launch directory and LLaMA-Factory / axolotl
    too; a YAML is often kept beside its JSON, so its own folder is tried first, then the working directory."""
    line = doc.line_of(key)
    named_by = f"{doc.source}{f':{line}' if line else ''}: {'.'.join(key)}"
    near = _relative(doc.source, written)
    if os.path.exists(near) or os.path.isabs(os.path.expanduser(written)):
        return _read_file(near, named_by)
    if os.path.exists(written):
        return _read_file(written, named_by)
    raise ConfigError(f"{named_by} names {written}, which cannot be read: no such file in the YAML's folder "
                      f"({os.path.dirname(doc.source) or '.'}) or the working directory ({os.getcwd()}); fix the path, "
                      "or run from the folder it is relative to")


def _read_file(path: str, named_by: str) -> Document:
    try:
        return read_document(path)
    except ConfigError as exc:
        raise ConfigError(f"{named_by} names {path}, which cannot be read: {exc}") from None
