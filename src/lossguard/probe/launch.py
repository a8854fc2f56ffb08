"""Launch one scenario as a real multi-rank job: `run_scenario(name, out_dir) -> RunResult`.

The job runs under `torchrun` in its own process group, with `DS_ACCELERATOR=cpu`, this package on
`PYTHONPATH` and a fresh free port, and its combined stdout+stderr goes byte for byte to `DIR/stdout.log`
(tqdm's `\\r` redraws included), which is what a user would have in their terminal scrollback.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import lossguard

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
                  halt_on: str | None = None) -> list[str]:
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
    return cmd


def run_scenario(name: str, out_dir: str | os.PathLike, nproc: int = 2, *, steps: int | None = None,
                 ds_config: dict | None = None, timeout_s: float = 300.0,
                 env: dict[str, str] | None = None, guard_events: str | None = None,
                 halt_on: str | None = None) -> RunResult:
    """Run scenario `name` for real and wait for it. A run that overstays `timeout_s` is killed as a group."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config_json = None
    if ds_config is not None:
        config_json = str(out / "ds_config.json")
        Path(config_json).write_text(json.dumps(ds_config, indent=1))
    cmd = build_command(name, out, nproc=nproc, port=free_port(), steps=steps, config_json=config_json,
                        guard_events=guard_events, halt_on=halt_on)
    stdout_path = out / "stdout.log"
    start = time.monotonic()
    timed_out = False
    with open(stdout_path, "wb") as log:
        # start_new_session: the job and every rank it forks share one process group we can kill on timeout.
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=job_env(env),
                                start_new_session=True)
        try:
            returncode = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            returncode = proc.wait()
    return RunResult(returncode, stdout_path, out, time.monotonic() - start, timed_out)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the job's own process group, then SIGKILL what is left after a grace period."""
    for sig, grace_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Run one zoo scenario for real on 2 CPU ranks.")
    parser.add_argument("scenario")
    parser.add_argument("out_dir")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--nproc", type=int, default=2)
    args = parser.parse_args(argv)
    result = run_scenario(args.scenario, args.out_dir, nproc=args.nproc, steps=args.steps)
    print(f"{args.scenario}: rc={result.returncode} wall={result.wall_s:.1f}s log={result.stdout_path}")
    return 0 if result.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
