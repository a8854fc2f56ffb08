"""`lossguard probe`: prove the fix. The same job under several config arms, compared step by step.

    from lossguard.probe.api import probe
    result = probe("ds.json", cmd="torchrun --nproc_per_node 2 train.py --deepspeed_config {config}",
                   report_dir="probe-out")
    result.comparison.verdict_line, result.exit_code, result.to_dict()

Each arm's config is written to `ARMS_DIR/NN-name/ds_config.json` and handed to the job through `{config}`
(or to the built-in tiny model through `--config-json`). The job is observed twice without code changes: the
guard attaches itself inside every rank (`monitor/autoattach.py`) and its output is parsed.
"""

from __future__ import annotations

import json
import re
import shlex
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lossguard.probe.arms import Arm, ArmsError, auto_arms, load_arms_file
from lossguard.probe.compare import ATOL, RTOL, ArmOutcome, Comparison, candidates, compare, judge, settle
from lossguard.probe.evidence import crash_line, diagnose_arm
from lossguard.probe.runner import DEFAULT_WORKLOAD, JobSpec, progress_printer, run_arm

RECOMMENDED_NAME = "recommended_config.json"
# Runs of each dying arm and of the fix candidate (same seed): a death or a survival that does not repeat
# is reported as such, never taken as proof. 2 keeps a healthy probe at one run per arm and a dying one at
# (dying arms + 1) extra runs; bench/probe_speed.py's figures are in docs/probe.md.
REPEATS = 2


class ProbeInputError(ValueError):
    """Bad input to probe (config, arms, command): one line, exit 2."""


@dataclass
class ProbeResult:
    config_path: Path
    arms: list[Arm]
    comparison: Comparison
    work_dir: Path
    recommended_path: Path | None
    report_paths: list[Path]

    @property
    def exit_code(self) -> int:
        return self.comparison.exit_code

    def to_dict(self) -> dict[str, Any]:
        rec = self.comparison.recommended
        return {
            "config": str(self.config_path),
            "verdict": self.comparison.verdict_line,
            "tolerance": {"atol": self.comparison.atol, "rtol": self.comparison.rtol},
            "arms": [o.to_dict() for o in self.comparison.outcomes],
            "recommended": None if rec is None else {"arm": rec.arm.name, "config_path": str(self.recommended_path)},
            "work_dir": str(self.work_dir),
        }


def load_inputs(config_path: str | Path, arms: str = "auto", cmd: str | None = None,
                workload: str = DEFAULT_WORKLOAD) -> tuple[dict[str, Any], list[Arm]]:
    """Validate everything before any job starts; all problems in one ProbeInputError."""
    from lossguard.lint.document import ConfigError
    from lossguard.lint.routes import open_route
    from lossguard.lint.run_config import launch_config

    problems: list[str] = []
    config: dict[str, Any] = {}
    try:  # lint's resolver: an accelerate / LLaMA-Factory / axolotl YAML becomes the DeepSpeed dict it names
        config = launch_config(open_route(str(config_path)))
    except ConfigError as exc:
        problems.append(str(exc))
    except OSError as exc:
        problems.append(f"{config_path}: cannot read the config ({exc.strerror})")
    if cmd is not None and "{config}" not in cmd:
        problems.append(f"--cmd {cmd!r} has no {{config}} placeholder: write where the arm's DeepSpeed config "
                        "goes, e.g. --cmd \"torchrun --nproc_per_node 2 train.py --deepspeed_config {config}\"")
    if cmd is None:
        from lossguard.probe.scenarios import SCENARIOS

        if workload not in SCENARIOS:
            problems.append(f"--workload {workload!r} is not a zoo scenario; known: {', '.join(SCENARIOS)}")
    arm_list: list[Arm] = []
    if arms != "auto":
        try:
            arm_list = load_arms_file(arms)
        except ArmsError as exc:
            problems.append(str(exc))
    if cmd is None:
        from lossguard.probe.auto_values import needed

        unfilled = needed(config)
        if unfilled:
            problems.append(f"{config_path}: {', '.join(unfilled)} {'is' if len(unfilled) == 1 else 'are'} \"auto\", "
                            "which the HF Trainer does not fill and DeepSpeed cannot read: give "
                            f"{'it a value' if len(unfilled) == 1 else 'them values'} (or probe your own "
                            "job with --cmd, whose Trainer fills it)")
    stack_problem = _job_stack_problem(cmd)
    if stack_problem is not None:
        problems.append(stack_problem)
    if problems:
        raise ProbeInputError("; ".join(problems))
    if arms == "auto":
        arm_list = auto_arms(config)
    return config, arm_list


def _job_stack_problem(cmd: str | None) -> str | None:
    """What the arms' interpreter cannot import (the training stack, lossguard for the auto-attach), if
    anything. A `--cmd` whose interpreter cannot be told (a shell script, a binary) is not checked."""
    from lossguard.monitor.autoattach import child_env
    from lossguard.probe.launch import job_env
    from lossguard.probe.preflight import USER_JOB_STACK, MissingPiece, check_job_stack, interpreter_of

    try:
        if cmd is None:
            check_job_stack("probe's built-in job", env=child_env(job_env()))
            return None
        env = child_env()
        python = interpreter_of(shlex.split(cmd), env)
        if python is not None:
            check_job_stack("the --cmd job", python=python, env=env, modules=USER_JOB_STACK)
    except MissingPiece as exc:
        return str(exc)
    except ValueError as exc:  # shlex: unbalanced quotes
        return f"--cmd {cmd!r} cannot be split into words ({exc})"
    return None


def probe(config_path: str | Path, *, arms: str = "auto", cmd: str | None = None, steps: int | None = None,
          nproc: int = 2, workload: str = DEFAULT_WORKLOAD, report_dir: str | Path | None = None,
          parallel: bool = False, timeout_s: float = 600.0, atol: float = ATOL, rtol: float = RTOL,
          show_progress: bool = True, repeats: int = REPEATS) -> ProbeResult:
    config_path = Path(config_path)
    config, arm_list = load_inputs(config_path, arms, cmd, workload)
    if steps is None and cmd is None:
        steps = 20
    spec = JobSpec(cmd=cmd, workload=workload, steps=steps, nproc=nproc, timeout_s=timeout_s)
    # The step count each arm must reach, when probe sets it (the built-in workload, or `{steps}` in --cmd).
    expected_steps = steps if cmd is None or "{steps}" in cmd else None
    work_dir = Path(report_dir) if report_dir is not None else Path(tempfile.mkdtemp(prefix="lossguard-probe-"))
    arms_dir = work_dir / "arms"
    arms_dir.mkdir(parents=True, exist_ok=True)

    def one(index: int, arm: Arm, attempt: int = 1) -> ArmOutcome:
        arm_dir = arms_dir / (f"{index:02d}-{_slug(arm.name)}" + (f".run{attempt}" if attempt > 1 else ""))
        label = arm.name + (f" (run {attempt})" if attempt > 1 else "")
        show = progress_printer(index, len(arm_list), label, steps) if show_progress else None
        run = run_arm(arm, arm.config(config), arm_dir, spec, progress=show)
        crash = crash_line([run.stdout_path]) if run.returncode != 0 and not run.timed_out else None
        return judge(arm, run, diagnose_arm(run.stdout_path, run.events_dir), expected_steps, crash)

    def each(jobs: list[tuple[int, Arm, int]]) -> list[ArmOutcome]:
        if parallel and len(jobs) > 1:
            with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
                return list(pool.map(lambda job: one(*job), jobs))
        return [one(*job) for job in jobs]

    outcomes = each([(i, arm, 1) for i, arm in enumerate(arm_list, 1)])
    _repeat(outcomes, each, repeats)
    comparison = compare(outcomes, atol=atol, rtol=rtol)
    recommended_path = None
    if comparison.recommended is not None:
        recommended_path = (work_dir / RECOMMENDED_NAME if report_dir is not None
                            else config_path.with_name(f"{config_path.stem}.recommended.json"))
        recommended_path.write_text(json.dumps(comparison.recommended.arm.config(config), indent=2) + "\n",
                                    encoding="utf-8")
    result = ProbeResult(config_path, arm_list, comparison, work_dir, recommended_path, [])
    if report_dir is not None:
        from lossguard.probe.report import write_reports

        result.report_paths = write_reports(result, Path(report_dir))
    return result


def _repeat(outcomes: list[ArmOutcome], each: Any, repeats: int) -> None:
    """Run again every arm that died (one that crashed before any step is a job that cannot start: it is
    not rerun), then, while the baseline still dies every time, the fix candidates in arm order until one
    survives every run. `each([(index, arm, attempt)])` runs them."""
    if repeats < 2:
        return
    index = {id(o): i for i, o in enumerate(outcomes, 1)}

    def again(chosen: list[ArmOutcome]) -> None:
        jobs = [(index[id(o)], o.arm, n) for o in chosen for n in range(2, repeats + 1)]
        later = each(jobs)
        for k, outcome in enumerate(chosen):
            settle(outcome, later[k * (repeats - 1):(k + 1) * (repeats - 1)])

    again([o for o in outcomes if o.dies and o.started])
    if outcomes[0].verdict != "dies":
        return
    for candidate in candidates(outcomes):
        again([candidate])
        if candidate.verdict == "survives":
            return


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", name).strip("_")[:60] or "arm"
