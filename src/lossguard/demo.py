"""`lossguard demo`: a real tiny DeepSpeed run dies, is caught live, diagnosed, its fix is run, and it is run
again with recovery on (it finishes, and says what was recovered).

Everything is real: a 2-layer GPT-2 from the fault-zoo kit trains with DeepSpeed on two CPU ranks over
gloo, the fault is a real mechanism (e.g. one infinite loss under bf16 ZeRO-2 with
`check_grad_overflow: false`), lossguard's Trainer callback watches every rank and stops the job with a
checkpoint, `lossguard analyze` reads what the job left behind, and the fixed configuration runs again.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from lossguard.probe.job import Job
from lossguard.probe.launch import build_command, free_port, job_env
from lossguard.probe.scenarios import get as get_scenario


@dataclass(frozen=True)
class Demo:
    scenario: str
    fix_label: str
    fix_changes: dict[str, Any] | None = None  # DeepSpeed config changes that fix it
    fix_scenario: str | None = None  # or: the twin scenario without the mistake (data / code fixes)


DEMOS: dict[str, Demo] = {
    "bf16-nan": Demo("bf16-nan", 'bf16.check_grad_overflow: true (DeepSpeed skips the bad step)',
                     fix_changes={"bf16": {"enabled": True, "check_grad_overflow": True}}),
    "masked-labels": Demo("masked-labels", "the conversation template the data was written with",
                          fix_scenario="healthy-zero2"),
    "fp16-overflow": Demo("fp16-overflow", "bf16 instead of fp16 (no 65504 ceiling)",
                          fix_changes={"fp16": {"enabled": False}, "bf16": {"enabled": True,
                                                                            "check_grad_overflow": True}}),
    "lora-reentrant": Demo("lora-reentrant", 'gradient_checkpointing_kwargs={"use_reentrant": False}',
                           fix_scenario="healthy-lora"),
}
DEFAULT = "bf16-nan"


def deep_merge(base: dict, changes: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


@dataclass
class ArmRun:
    name: str
    out_dir: Path
    returncode: int
    wall_s: float
    halted_at: int | None
    findings: list[dict]
    recoveries: list[dict]


def run_arm(name: str, scenario: str, out_dir: Path, console: Console, *, ds_config: dict | None,
            timeout_s: float = 240.0, recover: bool = False) -> ArmRun:
    """Launch one guarded two-rank job and print its steps as the guard records them (`recover`: the guard
    holds faulty steps instead of letting them through)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    config_json = None
    if ds_config is not None:
        config_json = str(out_dir / "ds_config.json")
        Path(config_json).write_text(json.dumps(ds_config, indent=2))
    events = out_dir / "events"
    cmd = build_command(scenario, out_dir, nproc=2, port=free_port(), steps=None, config_json=config_json,
                        guard_events=str(events), halt_on="broken", recover=recover)
    tail = _EventTail(events)
    with Job(cmd, out_dir / "stdout.log", env=job_env(None)) as job:
        returncode = job.wait(timeout_s, on_tick=lambda _elapsed_s: tail.show(console), tick_s=0.2)
    tail.show(console, final=True)
    return ArmRun(name, out_dir, returncode, job.elapsed_s, tail.halted_at, tail.findings, tail.recoveries)


class _EventTail:
    """Follows events-rank*.jsonl while the job runs: one printed line per optimizer step."""

    def __init__(self, events_dir: Path) -> None:
        self.events_dir = events_dir
        self.offsets: dict[Path, int] = {}
        self.steps: dict[int, dict[int, dict]] = {}
        self.printed = 0
        self.findings: list[dict] = []
        self._seen: set = set()
        self.halted_at: int | None = None
        self.recoveries: list[dict] = []  # one per held step (every rank writes it: kept once)

    def _read(self) -> None:
        for path in sorted(self.events_dir.glob("events-rank*.jsonl")):
            with open(path, "rb") as handle:
                handle.seek(self.offsets.get(path, 0))
                data = handle.read()
            complete = data[: data.rfind(b"\n") + 1]  # a line still being written waits for the next poll
            self.offsets[path] = self.offsets.get(path, 0) + len(complete)
            for raw in complete.splitlines():
                try:
                    entry = json.loads(raw)
                except ValueError:
                    continue
                if entry.get("type") == "record" and entry.get("kind") == "train":
                    self.steps.setdefault(entry["step"], {})[entry["rank"]] = entry["signals"]
                elif entry.get("type") == "finding":  # every rank writes every finding: keep one
                    key = (entry.get("code"), entry.get("step"), entry.get("rank"))
                    if key not in self._seen:
                        self._seen.add(key)
                        self.findings.append(entry)
                elif entry.get("type") == "halt" and self.halted_at is None:
                    self.halted_at = entry.get("step")
                elif entry.get("type") == "recovery" and entry.get("step") not in {r["step"] for r in self.recoveries}:
                    self.recoveries.append(entry)

    def show(self, console: Console, final: bool = False) -> None:
        self._read()
        ready = sorted(s for s, ranks in self.steps.items() if s > self.printed and (len(ranks) >= 2 or final))
        for step in ready:
            self._show_held(console, before=step)
            ranks = self.steps[step]
            losses = " | ".join(_num(ranks[r].get("raw_loss")) for r in sorted(ranks))
            grad = _num(next(iter(ranks.values())).get("grad_norm"))
            tokens = " | ".join(_num(ranks[r].get("num_label_tokens"), "g") for r in sorted(ranks))
            console.print(f"  step {step:>3}  loss {losses:<15} grad_norm {grad:<7} tokens {tokens}",
                          highlight=False)
            for finding in [f for f in self.findings if f.get("step") == step and not f.get("_shown")]:
                finding["_shown"] = True
                console.print(Text(f"  >>> lossguard {finding['code']} [{finding.get('signature')}] "
                                   f"{finding['message']}", style="bold red"))
            self.printed = step
        if final:
            self._show_held(console, before=None)

    def _show_held(self, console: Console, before: int | None) -> None:
        """The held steps before step `before` (None: all left), each on its line in step order."""
        for held in sorted((r for r in self.recoveries if not r.get("_shown")
                            and (before is None or r["step"] < before)), key=lambda r: r["step"]):
            held["_shown"] = True
            ranks = ", ".join(map(str, held.get("ranks") or [])) or "?"
            console.print(Text(f"  step {held['step']:>3}  >>> lossguard held the step on every rank: "
                               f"{held.get('signature')} on rank(s) {ranks} ({held.get('code')}); "
                               f"{held.get('kind')}, training goes on", style="bold cyan"))


def _num(value: Any, spec: str = ".4g") -> str:
    if value is None:
        return "-"
    if isinstance(value, str):  # the JSONL writes non-finite numbers as "nan" / "inf"
        return value
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return format(value, spec)


def halted_step(run: ArmRun) -> int | None:
    if run.halted_at is not None:
        return run.halted_at
    checkpoints = sorted(run.out_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))
    return int(checkpoints[-1].name.split("-")[-1]) if checkpoints else None


def list_demos() -> list[tuple[str, str]]:
    return [(name, get_scenario(demo.scenario).description) for name, demo in DEMOS.items()]
