"""Runs a two-rank live job under torchrun and reads back what rank 0 summarised."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from lossguard.probe.launch import free_port

JOBS = Path(__file__).parent / "live_jobs"
SRC = Path(__file__).resolve().parents[2] / "src"


@functools.cache
def fp16_supported() -> bool:
    """DeepSpeed's CPU accelerator runs fp16 only where oneDNN has fp16 kernels (AVX512-FP16 / AMX-FP16);
    elsewhere `deepspeed.initialize` refuses an fp16 config ("Type fp16 is not supported on your device"),
    so an fp16 scenario cannot run on this machine at all. Asked in a child, as the jobs would see it."""
    code = "from deepspeed.accelerator import get_accelerator; print(bool(get_accelerator().is_fp16_supported()))"
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    return proc.stdout.strip().endswith("True")


def runnable(scenarios: list[str]) -> list[str]:
    """The scenarios this machine can run: fp16 ones only where DeepSpeed supports fp16 here."""
    return [name for name in scenarios if "fp16" not in name or fp16_supported()]


def scenario_params(scenarios: list[str]) -> list:
    """pytest params that skip, saying why, an fp16 scenario this machine cannot run."""
    reason = "DeepSpeed does not support fp16 on this CPU (no oneDNN fp16 kernels: AVX512-FP16 / AMX-FP16)"
    return [pytest.param(name, marks=pytest.mark.skipif("fp16" in name and not fp16_supported(), reason=reason))
            for name in scenarios]


def run_job(script: str, out: Path, scenarios: list[str], timeout_s: int = 600) -> dict[str, dict]:
    env = {**os.environ, "PYTHONPATH": str(SRC), "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    torchrun = Path(sys.executable).parent / "torchrun"
    # A fresh port, never torchrun's default 29500: a job that outlived its test must not meet the next one.
    # Its own session, so that a timeout stops the ranks too: killing torchrun alone orphans them, and they
    # hold the port and their files while the next tests run.
    proc = subprocess.Popen([str(torchrun), "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
                             "--master_port", str(free_port()), str(JOBS / script), str(out), *scenarios],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_session(proc)
        raise
    log = stdout + stderr
    (out / f"{script}.log").write_text(log)
    assert proc.returncode == 0, f"every rank must exit cleanly; rc={proc.returncode}\n{log[-4000:]}"
    return {name: json.loads((out / name / "summary.json").read_text()) for name in scenarios}, log


def above_info(summary: dict) -> list[tuple]:
    return [(f["code"], f["step"], f["signature"]) for f in summary["findings"] if f["severity"] != "info"]


def signatures_at(summary: dict, step: int) -> set[str]:
    return {f["signature"] for f in summary["findings"] if f["step"] in (step, step + 1) and f["signature"]}


def kill_session(proc: subprocess.Popen) -> None:
    """SIGKILL the process's whole session (torchrun and the ranks it started in sessions of their own are
    found by their parent), then reap it."""
    pids = {proc.pid}
    for child in Path("/proc").glob("[0-9]*"):
        try:
            if os.getsid(int(child.name)) == proc.pid:
                pids.add(int(child.name))
        except (OSError, ValueError):
            continue
    for pid in _descendants(pids):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    proc.communicate()


def _descendants(pids: set[int]) -> set[int]:
    found, changed = set(pids), True
    while changed:
        changed = False
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                pid, ppid = int(stat.parent.name), int(stat.read_text().rsplit(")", 1)[1].split()[1])
                if ppid in found and pid not in found:
                    found.add(pid)
                    changed = True
    return found


def run_job_two_nodes(script: str, out: Path, scenarios: list[str], timeout_s: int = 600) -> dict[str, dict]:
    """The same job launched as two nodes of one rank each: two torchrun agents on this machine meeting
    at a static rendezvous, the way a multi-node launch starts (node_rank 0 and 1)."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(SRC), "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    torchrun = Path(sys.executable).parent / "torchrun"
    procs = [subprocess.Popen([str(torchrun), "--nnodes", "2", "--node_rank", str(node), "--nproc_per_node", "1",
                               "--master_addr", "127.0.0.1", "--master_port", str(port),
                               str(JOBS / script), str(out), *scenarios],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for node in (0, 1)]
    logs = [p.communicate(timeout=timeout_s)[0] for p in procs]
    for node, (proc, log) in enumerate(zip(procs, logs)):
        (out / f"{script}.node{node}.log").write_text(log)
        assert proc.returncode == 0, f"node {node} must exit cleanly; rc={proc.returncode}\n{log[-4000:]}"
    return {name: json.loads((out / name / "summary.json").read_text()) for name in scenarios}, "\n".join(logs)


def analyze_json(events_dir: Path) -> dict:
    """`lossguard analyze EVENTS_DIR --format json`, run as a user runs it."""
    proc = subprocess.run([sys.executable, "-m", "lossguard", "analyze", str(events_dir), "--format", "json"],
                          env={"PYTHONPATH": str(SRC)}, capture_output=True, text=True, timeout=120)
    return json.loads(proc.stdout)


def rank_outputs(out: Path, scenarios: list[str]) -> dict[str, list[dict]]:
    """Each scenario's rank{0,1}.json, the ranks' own account of a two-rank job."""
    return {name: [json.loads((out / name / f"rank{r}.json").read_text()) for r in (0, 1)] for name in scenarios}
