"""Launch one scenario as a real multi-rank job: `run_scenario(name, out_dir) -> RunResult`.

The job runs under `torchrun` as a `probe.job.Job` (its own process group, nothing of it left behind), with
`DS_ACCELERATOR=cpu`, this package on `PYTHONPATH` and a fresh free port, and its combined stdout+stderr goes
byte for byte to `DIR/stdout.log` (tqdm's `\\r` redraws included), which is what a user would have in their
terminal scrollback.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import lossguard
from lossguard.probe.job import Job, stop_jobs_on_signals

SRC_DIR = str(Path(lossguard.__file__).resolve().parent.parent)


@dataclass(frozen=True)
class RunResult:
    returncode: int
    stdout_path: Path
    out_dir: Path
    wall_s: float
    timed_out: bool = False

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")


def free_port() -> int:
    """A port the OS just handed out; two jobs launched back to back never share a rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = SRC_DIR + (os.pathsep + path if path else "")
    env["DS_ACCELERATOR"] = "cpu"
    # Unbuffered so stdout and stderr interleave in the order a terminal would show them.
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.update(extra or {})
    return env


def build_command(name: str, out_dir: Path, *, nproc: int, port: int, steps: int | None,
                  config_json: str | None, guard_events: str | None = None,
                  halt_on: str | None = None, recover: bool = False) -> list[str]:
    torchrun = Path(sys.executable).with_name("torchrun")
    launcher = [str(torchrun)] if torchrun.exists() else [sys.executable, "-m", "torch.distributed.run"]
    cmd = [*launcher, "--nproc_per_node", str(nproc), "--master_addr", "127.0.0.1", "--master_port", str(port),
           "-m", "lossguard.probe.train_job", "--scenario", name, "--out", str(out_dir)]
    if steps is not None:
        cmd += ["--steps", str(steps)]
    if config_json is not None:
        cmd += ["--config-json", config_json]
    if guard_events is not None:
        cmd += ["--guard-events", guard_events]
        if halt_on:
            cmd += ["--halt-on", halt_on]
        if recover:
            cmd += ["--recover"]
    return cmd


def run_scenario(name: str, out_dir: str | os.PathLike, nproc: int = 2, *, steps: int | None = None,
                 ds_config: dict | None = None, timeout_s: float = 300.0,
                 env: dict[str, str] | None = None, guard_events: str | None = None,
                 halt_on: str | None = None) -> RunResult:
    """Run scenario `name` for real and wait for it. A run that overstays `timeout_s` is stopped as a group."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config_json = None
    if ds_config is not None:
        config_json = str(out / "ds_config.json")
        Path(config_json).write_text(json.dumps(ds_config, indent=1))
    cmd = build_command(name, out, nproc=nproc, port=free_port(), steps=steps, config_json=config_json,
                        guard_events=guard_events, halt_on=halt_on)
    with Job(cmd, out / "stdout.log", env=job_env(env)) as job:
        returncode = job.wait(timeout_s)
    return RunResult(returncode, job.log_path, out, job.elapsed_s, job.timed_out)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Run one zoo scenario for real on 2 CPU ranks.")
    parser.add_argument("scenario")
    parser.add_argument("out_dir")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--nproc", type=int, default=2)
    args = parser.parse_args(argv)
    with stop_jobs_on_signals():
        result = run_scenario(args.scenario, args.out_dir, nproc=args.nproc, steps=args.steps)
    print(f"{args.scenario}: rc={result.returncode} wall={result.wall_s:.1f}s log={result.stdout_path}")
    return 0 if result.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
