"""Probe arms: the user's config plus the changes worth proving. Pure data: no torch import.

An arm is a name and `changes`, `{dotted.key: value}` applied to the user's config (`None` deletes the key,
so "back to DeepSpeed's default" is expressible). `auto_arms(config)` proposes the fixes the linter finds for
the config and the prevention defaults (`knowledge_arms`: what the known issues' fixes recommend) that would
change it; `load_arms_file(path)` reads a JSON/YAML list of `{name, changes}`. The baseline (no change) is always the first arm.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lossguard.lint.context import get_in, split
from lossguard.lint.fix import apply_to_dict
from lossguard.lint.rules.base import Edit

BASELINE = "baseline"


class ArmsError(ValueError):
    """A bad arms file: the message names the file, the entry and the value received."""


@dataclass(frozen=True)
class Arm:
    name: str
    changes: dict[str, Any] = field(default_factory=dict)
    reason: str = ""  # why this arm, as the user reads it: a lint code, an `explain` id, "from FILE"

    @property
    def is_baseline(self) -> bool:
        return not self.changes

    def config(self, base: dict[str, Any]) -> dict[str, Any]:
        return apply_changes(base, self.changes)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "changes": dict(self.changes), "reason": self.reason}


def apply_changes(config: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    edits = [Edit("delete", split(k)) if v is None else Edit("set", split(k), v) for k, v in changes.items()]
    return apply_to_dict(config, edits)


def describe(changes: dict[str, Any]) -> str:
    """`bf16.check_grad_overflow: true, zero_optimization.stage: 3` (JSON values; deletions as `default`)."""
    if not changes:
        return BASELINE
    return ", ".join(f"{k}: {'default' if v is None else json.dumps(v)}" for k, v in changes.items())


# -- auto -----------------------------------------------------------------------------------------------------
def _enabled(config: dict[str, Any], section: str) -> bool:
    value = get_in(config, f"{section}.enabled", False)
    return value is True or value == "auto" or str(value).lower() == "true"


def knowledge_arms(config: dict[str, Any]) -> list[Arm]:
    """The prevention defaults (the known issues' fixes) that change this config (each one an arm)."""
    stage = get_in(config, "zero_optimization.stage", 0)
    try:
        stage = int(stage)
    except (TypeError, ValueError):
        stage = 0
    arms: list[Arm] = []
    if stage in (1, 2) and get_in(config, "zero_optimization.overlap_comm") not in (None, False, "false"):
        arms.append(Arm("", {"zero_optimization.overlap_comm": False}, "overlap_comm races (explain zero12-overlap-race)"))
    if _enabled(config, "bf16") and stage in (1, 2) and get_in(config, "bf16.check_grad_overflow") is not True:
        arms.append(Arm("", {"bf16.check_grad_overflow": True}, "bf16 ZeRO-1/2 overflow check (explain bf16-no-overflow-check)"))
    if get_in(config, "communication_data_type") is not None:
        arms.append(Arm("", {"communication_data_type": None}, "default communication dtype (explain DSC102)"))
    if _enabled(config, "fp16"):
        arms.append(Arm("", {"fp16.enabled": False, "bf16.enabled": True}, "bf16 instead of fp16 (explain fp16-activation-overflow)"))
    if stage in (1, 2):
        arms.append(Arm("", {"zero_optimization.stage": 3}, "ZeRO-3 when ZeRO-1/2 misbehaves"))
    return arms


def lint_arms(config: dict[str, Any], env: dict[str, str] | None = None) -> list[Arm]:
    """One arm per lint finding whose fix edits the config."""
    from lossguard.lint.api import lint
    from lossguard.lint.rules.base import fix_of

    arms = []
    for finding in lint(config, env=env):
        fix = fix_of(finding)
        if fix is None or not fix.edits:
            continue
        changes = {".".join(e.path): (e.value if e.op == "set" else None) for e in fix.edits}
        arms.append(Arm("", changes, f"lint {finding.code} {finding.name}"))
    return arms


def auto_arms(config: dict[str, Any], *, env: dict[str, str] | None = None) -> list[Arm]:
    """Baseline, then lint fixes, then the prevention defaults; arms giving the same config are merged."""
    out = [Arm(BASELINE, {}, "your config")]
    seen = {_key(config)}
    for arm in lint_arms(config, env) + knowledge_arms(config):
        key = _key(arm.config(config))
        if key in seen:
            continue
        seen.add(key)
        out.append(Arm(describe(arm.changes), arm.changes, arm.reason))
    return out


def _key(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True, default=str)


# -- from a file ----------------------------------------------------------------------------------------------
def load_arms_file(path: str | Path) -> list[Arm]:
    """A JSON/YAML list of `{name, changes: {dotted.key: value}}` (or `{"arms": [...]}`). Baseline first."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ArmsError(f"{path}: cannot read the arms file ({exc.strerror})") from None
    try:
        if path.suffix.lower() in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as exc:
        kind = "YAML" if path.suffix.lower() in (".yaml", ".yml") else "JSON"
        where = (f"line {exc.lineno} column {exc.colno}: {exc.msg}" if isinstance(exc, json.JSONDecodeError)
                 else str(exc).splitlines()[0])
        raise ArmsError(f"{path}: not valid {kind} ({where}); fix the syntax: the file is a list of "
                        '{"name": ..., "changes": {"dotted.key": value}}') from None
    if isinstance(data, dict) and "arms" in data:
        data = data["arms"]
    if not isinstance(data, list) or not data:
        raise ArmsError(f"{path}: expected a non-empty list of {{name, changes}}, got {type(data).__name__}")
    arms, problems, names = [], [], set()
    for i, item in enumerate(data):
        where = f"{path}: arm {i + 1}"
        if not isinstance(item, dict):
            problems.append(f"{where}: expected {{name, changes}}, got {item!r}")
            continue
        changes = item.get("changes", {})
        unknown = set(item) - {"name", "changes", "reason"}
        if unknown:
            problems.append(f"{where}: unknown keys {sorted(unknown)} (allowed: name, changes)")
        if not isinstance(changes, dict) or not all(isinstance(k, str) and k for k in changes):
            problems.append(f"{where}: `changes` must map dotted.key to a value, got {changes!r}")
            continue
        name = str(item.get("name") or describe(changes))
        if name in names:
            problems.append(f"{where}: duplicate arm name {name!r}")
        names.add(name)
        arms.append(Arm(name, dict(changes), str(item.get("reason", f"from {path.name}"))))
    if problems:
        raise ArmsError("; ".join(problems))
    if not any(a.is_baseline for a in arms):
        arms.insert(0, Arm(BASELINE, {}, "your config"))
    else:
        arms.sort(key=lambda a: not a.is_baseline)
    return arms
