"""What the config a route reaches means for the run: facts for `analyze --config`, a dict for `probe`.

Both start from `routes.open_route`, the resolver `lint` uses, so an accelerate YAML, a LLaMA-Factory /
axolotl YAML and the DeepSpeed JSON they name mean the same run to every verb.

A fact is evidence only with its location, so each one cites where the user wrote it: a key of a DeepSpeed
file its line (`ds_z2.json:18`), a key accelerate builds from its YAML the YAML line it came from
(`acc.yaml:5`), launch facts the YAML's `num_processes` / `mixed_precision` line. A value no one wrote says
whose default it is (`acc.yaml (accelerate default)`, `ds.json (DeepSpeed default)`), so the run's own
config dump in the log replaces it.
"""

from __future__ import annotations

import copy
import os
from typing import Any

from lossguard.core.dsconfig import as_bool, as_int
from lossguard.core.facts import RunFacts, Where, facts_from_ds_config
from lossguard.lint.document import Document
from lossguard.lint.routes import ACCELERATE_KEYS, Route

__all__ = ["launch_config", "route_facts"]

Path = tuple[str, ...]


def route_facts(route: Route) -> RunFacts:
    """The run facts the route's config states, the DeepSpeed config first: a launch fact (accelerate's
    mixed_precision, the training YAML's bf16) only fills what the config leaves "auto" or unset."""
    facts = facts_from_ds_config(route.doc.data, _name(route.shown), _where(route))
    facts.merge(_launch_facts(route))
    facts.merge(_args_facts(route))
    return facts


def launch_config(route: Route) -> dict[str, Any]:
    """The DeepSpeed config dict the job gets: the route's config with the precision accelerate's
    `DeepSpeedPlugin.set_mixed_precision` writes from `mixed_precision` (an absent fp16 / bf16 section is
    added, "auto" is filled); the rest of "auto" is left for the Trainer, as at launch."""
    config = copy.deepcopy(route.doc.data)
    precision = route.launch.get("mixed_precision")
    if precision not in ("bf16", "fp16", "no"):
        return config
    for kind in ("bf16", "fp16"):
        section = config.get(kind)
        if not isinstance(section, dict):
            config[kind] = {"enabled": kind == precision}
        elif section.get("enabled", "auto") == "auto":
            section["enabled"] = kind == precision
    return config


def _name(path: str) -> str:
    return os.path.basename(path) or path


def _line(doc: Document, path: Path) -> str | None:
    span = doc.spans.get(path)
    return f"{_name(doc.source)}:{span.line}" if span is not None else None


def _where(route: Route) -> Where | None:
    """Where a key of `route.doc.data` was written, for each shape of route."""
    via, doc = route.via, route.doc
    if not route.synthesized:
        return lambda path: _line(doc, path)
    if via is None:  # an inline --deepspeed '{...}' in a command: no file to point at
        return None
    if route.args_file:  # LLaMA-Factory / axolotl inline `deepspeed:` mapping
        return lambda path: _line(via, ("deepspeed", *path))

    def accelerate(path: Path) -> str | None:
        key = ACCELERATE_KEYS.get(path)
        if key is None:
            return None
        return _line(via, ("deepspeed_config", key)) or f"{_name(via.source)} (accelerate default)"

    return accelerate


def _launch_facts(route: Route) -> RunFacts:
    """accelerate's num_processes (all machines together), num_machines and mixed_precision."""
    facts = RunFacts()
    if route.via is None:
        return facts
    at = route.via

    def put(name: str, value: Any, key: str) -> None:
        facts.set(name, value, _line(at, (key,)) or _name(at.source))

    put("world_size", route.launch.get("world_size"), "num_processes")
    put("num_nodes", route.launch.get("num_nodes"), "num_machines")
    precision = route.launch.get("mixed_precision")
    if precision in ("bf16", "fp16", "no"):  # as set_mixed_precision fills the DeepSpeed config
        put("bf16", precision == "bf16", "mixed_precision")
        put("fp16", precision == "fp16", "mixed_precision")
    return facts


def _args_facts(route: Route) -> RunFacts:
    """A LLaMA-Factory / axolotl YAML is the Trainer's arguments too: what it writes fills "auto"."""
    facts = RunFacts()
    if not route.args_file or route.via is None:
        return facts
    data = route.via.data
    for name, read in (("bf16", as_bool), ("fp16", as_bool), ("gradient_checkpointing", as_bool),
                       ("gradient_accumulation_steps", as_int)):
        facts.set(name, read(data.get(name)), _line(route.via, (name,)) or _name(route.via.source))
    return facts
