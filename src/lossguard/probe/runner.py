"""Run one probe arm for real: write its config, launch the job with auto-attach, follow its steps.

The job is either the user's own launch command (`--cmd "torchrun ... train.py --deepspeed_config {config}"`,
through whatever launcher it names) or the built-in tiny model (`train_job` with `--config-json`). Either way
it runs as a `probe.job.Job` (its own process group, stopped as a whole) with `lossguard/data/autoattach` on
`PYTHONPATH` (the guard attaches itself to `deepspeed.initialize` / `transformers.Trainer` inside every rank,
events in `ARM_DIR/events`), a fresh rendezvous port, and its combined output in `ARM_DIR/stdout.log`.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lossguard.monitor.autoattach import child_env
from lossguard.probe.arms import Arm
from lossguard.probe.job import Job

DEFAULT_WORKLOAD = "healthy-raw"  # the zoo's raw `deepspeed.initialize` loop on the tiny GPT-2
POLL_S = 0.5


@dataclass
class ArmRun:
    arm: Arm
    dir: Path
    config_path: Path
    returncode: int
    wall_s: float
    timed_out: bool
    last_step: int | None

    @property
    def stdout_path(self) -> Path:
        return self.dir / "stdout.log"

    @property
    def events_dir(self) -> Path:
        return self.dir / "events"


@dataclass(frozen=True)
class JobSpec:
    """How every arm is launched: the same command, seed and data order; only `{config}` differs."""

    cmd: str | None = None  # the user's launch command with `{config}` (and optionally `{steps}`)
    workload: str = DEFAULT_WORKLOAD  # zoo scenario for the built-in model (no --cmd)
    steps: int | None = None
    nproc: int = 2
    timeout_s: float = 600.0


def command_for(spec: JobSpec, config_path: Path, arm_dir: Path, port: int) -> list[str]:
    if spec.cmd is not None:
        fill = {"{config}": str(config_path), "{steps}": str(spec.steps or "")}
        argv = []
        for token in shlex.split(spec.cmd):
            for placeholder, value in fill.items():
                token = token.replace(placeholder, value)
            argv.append(token)
        return argv
    from lossguard.probe.launch import build_command

    return build_command(spec.workload, arm_dir, nproc=spec.nproc, port=port, steps=spec.steps,
                         config_json=str(config_path))


def arm_env(spec: JobSpec, arm_dir: Path, port: int) -> dict[str, str]:
    if spec.cmd is None:
        from lossguard.probe.launch import job_env

        env = job_env()
    else:
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONHASHSEED"] = "0"  # same hashing (set order, ...) in every arm
    # torchrun reads PET_* for its defaults: arms never share a rendezvous, even when run in parallel.
    env.setdefault("PET_MASTER_PORT", str(port))
    env.setdefault("MASTER_PORT", str(port))
    return child_env(env, events_dir=arm_dir / "events")


def run_arm(arm: Arm, config: dict[str, Any], arm_dir: Path, spec: JobSpec,
            progress: Callable[..., None] | None = None) -> ArmRun:
    """Run `arm` to the end (or `spec.timeout_s`, then stop its group). `progress(step, loss, elapsed_s)` is
    called as steps appear in the job's output, and once more at the end with a fourth argument True."""
    from lossguard.probe.launch import free_port

    arm_dir.mkdir(parents=True, exist_ok=True)
    config_path = arm_dir / "ds_config.json"
    config_path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    port = free_port()
    argv = command_for(spec, config_path, arm_dir, port)
    (arm_dir / "command.json").write_text(json.dumps({"argv": argv, "arm": arm.to_dict()}, indent=1) + "\n")
    follower = _Follower(arm_dir / "stdout.log")

    def follow(elapsed_s: float) -> None:
        if progress is not None and follower.poll():
            progress(follower.step, follower.loss, elapsed_s)

    with Job(argv, arm_dir / "stdout.log", env=arm_env(spec, arm_dir, port)) as job:
        returncode = job.wait(spec.timeout_s, on_tick=follow, tick_s=POLL_S)
    follower.poll()
    if progress is not None:
        progress(follower.step, follower.loss, job.elapsed_s, True)
    return ArmRun(arm, arm_dir, config_path, returncode, job.elapsed_s, job.timed_out, follower.step)


class _Follower:
    """Reads what the job has written so far and keeps its last step and loss (the `analyze` text parser)."""

    def __init__(self, path: Path) -> None:
        from lossguard.sources.text_log import TextLogParser

        self.path = path
        self.parser = TextLogParser(path.name)
        self.offset = 0
        self.pending = b""
        self.step: int | None = None
        self.loss: float | None = None
        self.line_no = 0

    def poll(self) -> bool:
        """True when a new step appeared."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            return False
        self.offset += len(chunk)
        lines = (self.pending + chunk).split(b"\n")
        self.pending = lines.pop()
        before = self.step
        for line in lines:
            self.line_no += 1
            try:
                records = self.parser.parse_line(line, self.line_no)
            except Exception:
                continue
            for record in records:
                if getattr(record, "step", None) is None:
                    continue
                signals = getattr(record, "signals", None) or {}
                if "loss" in signals:
                    self.step = record.step if self.step is None else max(self.step, record.step)
                    self.loss = signals["loss"]
        return self.step != before


def progress_printer(index: int, total: int, name: str, steps: int | None,
                     stream=None) -> Callable[..., None]:
    """One line per arm, redrawn in place on a terminal; on a pipe only the arm's final line."""
    stream = stream or sys.stderr
    tty = stream.isatty()
    label = f"[{index}/{total}] {name[:48]:<48}"

    def show(step: int | None, loss: float | None, elapsed_s: float, final: bool = False) -> None:
        where = "starting" if step is None else f"step {step}" + (f"/{steps}" if steps else "")
        text = f"{label} {where:<12} loss {loss:.4g}" if loss is not None else f"{label} {where:<12}"
        text += f"  {elapsed_s:5.1f}s"
        if tty:
            stream.write("\r" + text.ljust(100) + ("\n" if final else ""))
            stream.flush()
        elif final:
            stream.write(text + "\n")
            stream.flush()

    return show
