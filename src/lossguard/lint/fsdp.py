"""The FSDP settings a run uses, read from whichever file holds them: an accelerate YAML
(`distributed_type: FSDP` + `fsdp_config`), the HF Trainer's `fsdp` / `fsdp_config` arguments (in a training
YAML, a TrainingArguments JSON, a `--fsdp_config` JSON or a launch command), axolotl / LLaMA-Factory YAMLs,
torchtitan TOML, torchtune recipes, llm-foundry (Composer) YAMLs and verl's FSDP engine config.

Pure: a dict in, an `FsdpView` out (normalized names, each with the dotted key the user wrote), validated
once here: a value of the wrong type raises ConfigError naming the key and the value.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from lossguard.lint.document import ConfigError

_BOOLS = ("use_orig_params", "sync_module_states", "cpu_ram_efficient_loading", "activation_checkpointing",
          "offload_params", "forward_prefetch", "limit_all_gathers")
# Keys only axolotl / LLaMA-Factory training YAMLs have (an HF TrainingArguments dump has an fsdp_config too).
_YAML_MARKERS = ("base_model", "datasets", "micro_batch_size", "finetuning_type", "template", "cutoff_len")
_TRAINER_OPTIONS = ("full_shard", "shard_grad_op", "no_shard", "hybrid_shard", "hybrid_shard_zero2", "offload",
                    "auto_wrap")


@dataclass
class FsdpView:
    """What lint knows of the FSDP setup: `values` by normalized name, `paths` where each was written."""

    kind: str  # accelerate / trainer / trainer-fsdp-config / torchtitan / torchtune / composer / verl
    values: dict[str, Any] = field(default_factory=dict)
    paths: dict[str, str] = field(default_factory=dict)

    def get(self, name: str, default: Any = None) -> Any:
        return self.values.get(name, default)

    def path(self, name: str, fallback: str = "fsdp_config") -> str:
        return self.paths.get(name, fallback)

    @property
    def version(self) -> int:
        """1 unless a key says 2 (accelerate's and the Trainer's default; torchtitan / torchtune use FSDP2)."""
        return self.values.get("version", 1)

    @property
    def hf(self) -> bool:
        """The Trainer / accelerate read these keys (the hazards of their FSDP plugin apply)."""
        return self.kind in ("accelerate", "trainer", "trainer-fsdp-config")


def _bool(value: Any, key: str, source: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ConfigError(f"{source}: {key} = {value!r} is not true or false; write true or false")


def _version(value: Any, key: str, source: str) -> int:
    if not isinstance(value, bool) and str(value).strip() in ("1", "2"):
        return int(str(value).strip())
    raise ConfigError(f"{source}: {key} = {value!r} is not an FSDP version; write 1 or 2")


def _section(data: dict[str, Any], key: str, source: str) -> dict[str, Any]:
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{source}: {key} must be a mapping of FSDP options, got {type(value).__name__} "
                          f"{str(value)[:40]!r}; write it as `{key}:` with keys under it")
    return value


def _read_keys(view: FsdpView, section: dict[str, Any], prefix: str, source: str) -> None:
    """accelerate / Trainer keys, with or without their `fsdp_` prefix (the Trainer strips it)."""
    for key, value in section.items():
        name = key[5:] if key.startswith("fsdp_") else key
        if value is None:
            continue
        where = f"{prefix}.{key}" if prefix else key
        if name in _BOOLS:
            value = _bool(value, where, source)
        elif name == "version":
            value = _version(value, where, source)
        elif name in ("sharding_strategy", "reshard_after_forward", "state_dict_type") and isinstance(value, str):
            value = value.strip().upper() if name != "reshard_after_forward" else value
        view.values[name] = value
        view.paths[name] = where


def from_accelerate(data: dict[str, Any], source: str) -> FsdpView:
    view = FsdpView("accelerate")
    _read_keys(view, _section(data, "fsdp_config", source), "fsdp_config", source)
    precision = data.get("mixed_precision")
    if precision is not None:
        view.values["mixed_precision"] = str(precision).strip().lower()
        view.paths["mixed_precision"] = "mixed_precision"
    return view


def _trainer_options(value: Any, source: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, bool):
        return ["full_shard"] if value else []
    if isinstance(value, str):
        words = value.replace(",", " ").split()
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        words = [w for v in value for w in v.split()]
    else:
        raise ConfigError(f"{source}: fsdp = {value!r} is not a list of FSDP options; write e.g. "
                          "\"full_shard auto_wrap\"")
    bad = [w for w in words if w.lower() not in _TRAINER_OPTIONS]
    if bad:
        raise ConfigError(f"{source}: fsdp option {bad[0]!r} is not one of {', '.join(_TRAINER_OPTIONS)}")
    return [w.lower() for w in words]


def from_trainer(data: dict[str, Any], source: str, *, base: str = "") -> FsdpView:
    """The Trainer's `fsdp` options and `fsdp_config` (a mapping, or the path of a JSON file)."""
    view = FsdpView("trainer")
    options = _trainer_options(data.get("fsdp"), source)
    if options:
        view.values["options"] = options
        view.paths["options"] = "fsdp"
        view.values["offload_params"] = "offload" in options
    if data.get("fsdp_version") is not None:  # axolotl writes it beside fsdp_config
        view.values["version"] = _version(data["fsdp_version"], "fsdp_version", source)
        view.paths["version"] = "fsdp_version"
    section = data.get("fsdp_config")
    if isinstance(section, str) and section.strip().startswith("{"):  # --fsdp_config '{...}' on a command line
        section = _inline(section, source)
        _read_keys(view, section, "fsdp_config", source)
        return view
    if isinstance(section, str) and section.strip():
        section = _read_named(section, base or source)
        _read_keys(view, section, "", f"{source}: fsdp_config {data['fsdp_config']}")
        return view
    _read_keys(view, _section(data, "fsdp_config", source), "fsdp_config", source)
    return view


def _inline(text: str, source: str) -> dict[str, Any]:
    import json

    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{source}: --fsdp_config is not valid JSON ({exc}); quote it as one JSON object") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{source}: --fsdp_config must be a JSON object of FSDP options")
    return value


def _read_named(path: str, source: str) -> dict[str, Any]:
    from lossguard.lint.document import read_document

    near = os.path.join(os.path.dirname(source), path) if not os.path.isabs(path) else path
    target = near if os.path.exists(near) else path
    try:
        return read_document(target).data
    except ConfigError as exc:
        raise ConfigError(f"{source}: fsdp_config names {path}, which cannot be read: {exc}") from None


def from_fsdp_config_file(data: dict[str, Any], source: str) -> FsdpView:
    """A `--fsdp_config` JSON on its own: the options it sets (the `--fsdp` string is on the command line)."""
    view = FsdpView("trainer-fsdp-config")
    _read_keys(view, {k: v for k, v in data.items() if not k.startswith("xla")}, "", source)
    if data.get("xla"):
        view.values["xla"] = True
        view.paths["xla"] = "xla"
    return view


def _native(kind: str, data: dict[str, Any], source: str) -> FsdpView:
    """torchtitan / torchtune / Composer / verl: read so that lint accepts them; the Trainer / accelerate
    hazards do not apply (their own trainers wrap, checkpoint and clip)."""
    view = FsdpView(kind)
    if kind in ("torchtitan", "torchtune"):
        view.values["version"] = 2
    if kind == "composer":
        _read_keys(view, _section(data, "fsdp_config", source), "fsdp_config", source)
    if kind == "verl" and data.get("use_orig_params") is not None:
        view.values["use_orig_params"] = _bool(data["use_orig_params"], "use_orig_params", source)
        view.paths["use_orig_params"] = "use_orig_params"
    return view


def _has_component(data: dict[str, Any]) -> bool:
    return any(isinstance(v, dict) and "_component_" in v for v in data.values())


def _trainer_fsdp(value: Any) -> bool:
    """The Trainer's `fsdp` argument is set (a dump writes "" or [] when FSDP is off)."""
    return value not in (None, "", [], False) and not isinstance(value, dict)


def kind_of(data: dict[str, Any]) -> str | None:
    """Which FSDP config shape `data` is, or None for anything else (a DeepSpeed config, plain arguments)."""
    if str(data.get("distributed_type", "")).strip().upper() == "FSDP":
        return "accelerate"
    if ("fsdp_cpu_offload" in data or isinstance(data.get("fsdp"), dict)) and _has_component(data):
        return "torchtune"
    if isinstance(data.get("fsdp_config"), dict) and any(k in data for k in ("max_duration", "global_train_batch_size")):
        return "composer"
    if str(data.get("strategy", "")).strip().lower() in ("fsdp", "fsdp2") and ("_target_" in data or "fsdp_size" in data):
        return "verl"
    if isinstance(data.get("parallelism"), dict) and isinstance(data.get("training"), dict):
        return "torchtitan"
    if _trainer_fsdp(data.get("fsdp")) or (data.get("fsdp_config") is not None and "fsdp_version" in data):
        return "trainer"
    section = data.get("fsdp_config")
    if isinstance(section, dict) and section and "fsdp" not in data and any(k in data for k in _YAML_MARKERS):
        return "trainer"  # axolotl: an fsdp_config mapping alone turns FSDP on
    keys = list(data)
    if keys and any(k.startswith("fsdp_") for k in keys) and all(k.startswith(("fsdp_", "xla")) for k in keys):
        return "trainer-fsdp-config"
    return None


def read_view(data: dict[str, Any], source: str, kind: str | None = None) -> FsdpView | None:
    """The FSDP view of a config dict (None when it is no FSDP config). Raises ConfigError on a bad value."""
    kind = kind or kind_of(data)
    if kind is None:
        return None
    if kind == "accelerate":
        return from_accelerate(data, source)
    if kind == "trainer":
        return from_trainer(data, source)
    if kind == "trainer-fsdp-config":
        return from_fsdp_config_file(data, source)
    return _native(kind, data, source)


def from_args(args: dict[str, Any] | None) -> FsdpView | None:
    """The Trainer's `--fsdp` / `--fsdp_config` from training arguments or a launch command."""
    if not args or not _trainer_fsdp(args.get("fsdp")):
        return None
    return from_trainer(args, str(args.get("origin", "training arguments")))
