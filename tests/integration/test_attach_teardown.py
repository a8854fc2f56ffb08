"""Two-rank torchrun jobs with the live guard attached (`watch --attach`) exit 0 at teardown, run after run
(issue #16 saw 3 non-zero exits in 20). Real jobs: a tiny GPT-2 under transformers.Trainer + DeepSpeed ZeRO-2
on CPU over gloo. 5 runs in the default suite, 20 in the slow one.

torch 2.13 + gloo on CPU aborts a rank at interpreter exit now and then with no lossguard in the job at all
("terminate called without an active exception": 1 of 65 plain torchrun runs of this job, 2 of 70 attached
ones, 2026-11-26). A run that ends that way is run once more; the series fails when a rerun fails too, or when
more runs needed one than its budget allows (one in ten, at least one): a guard that broke teardown, as in
issue #16, fails far more often than that."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from .watch_helpers import JOBS_DIR

pytestmark = pytest.mark.integration

pytest.importorskip("deepspeed")
pytest.importorskip("transformers")

TORCHRUN = Path(sys.executable).with_name("torchrun")
SRC = Path(__file__).resolve().parents[2] / "src"


def _attached_run(out: Path) -> tuple[int, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    launcher = [str(TORCHRUN)] if TORCHRUN.exists() else [sys.executable, "-m", "torch.distributed.run"]
    env = {**os.environ, "PYTHONPATH": str(SRC), "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "lossguard", "watch", "--attach", "--report", str(out), "--",
                           *launcher, "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port",
                           str(port), str(JOBS_DIR / "tiny_train.py"), "trainer", "--steps", "10"],
                          env=env, capture_output=True, timeout=300)
    return proc.returncode, (proc.stdout + proc.stderr).decode(errors="replace")


UPSTREAM_ABORT = "terminate called without an active exception"


def _series(tmp_path: Path, runs: int) -> None:
    failed, rerun = [], []
    budget = max(1, runs // 10)
    for number in range(runs):
        out = tmp_path / f"run{number}"
        code, log = _attached_run(out)
        if code != 0 and UPSTREAM_ABORT in log and len(rerun) < budget:
            rerun.append(f"run {number}: exit {code}, rerun\n{log[-1500:]}")
            out = tmp_path / f"run{number}-again"
            code, log = _attached_run(out)
        if code != 0:
            failed.append(f"run {number}: exit {code}\n{log[-3000:]}")
        else:  # the guard was really attached: each rank wrote its events
            assert sorted(p.name for p in (out / "events").glob("events-rank*.jsonl")) == \
                ["events-rank0.jsonl", "events-rank1.jsonl"], log[-3000:]
    assert not failed, (f"{len(failed)} of {runs} attached runs exited non-zero ({len(rerun)} run again after "
                        f"torch's teardown abort):\n" + "\n".join(rerun + failed))


def test_five_attached_two_rank_runs_all_exit_0(tmp_path):
    _series(tmp_path, 5)


@pytest.mark.slow
def test_twenty_attached_two_rank_runs_all_exit_0(tmp_path):
    _series(tmp_path, 20)
