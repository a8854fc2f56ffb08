"""`lossguard watch --attach --recover`: the guard attached inside an unmodified two-rank raw DeepSpeed job
(bf16 ZeRO-2, `check_grad_overflow: false`, one infinite loss on the last rank at step 5, which without
recovery writes NaN into the weights) holds that step, replays it, and the job trains on to the end."""

from __future__ import annotations

import json
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
ENV = {**os.environ, "PYTHONPATH": str(SRC), "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}


def _watch(out: Path, *flags: str) -> subprocess.CompletedProcess:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    launcher = [str(TORCHRUN)] if TORCHRUN.exists() else [sys.executable, "-m", "torch.distributed.run"]
    return subprocess.run([sys.executable, "-m", "lossguard", "watch", *flags, "--report", str(out), "--",
                           *launcher, "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port",
                           str(port), str(JOBS_DIR / "tiny_train.py"), "raw", "--steps", "10", "--inf-step", "5",
                           "--out", str(out / "job")],
                          env=ENV, capture_output=True, text=True, timeout=600)


def test_an_attached_guard_recovers_the_step_and_the_job_trains_on(tmp_path):
    proc = _watch(tmp_path, "--attach", "--recover")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [json.loads(x) for x in (tmp_path / "events" / "events-rank0.jsonl").read_text().splitlines()]
    recoveries = [x for x in lines if x["type"] == "recovery"]
    assert [(r["step"], r["ranks"], r["kind"]) for r in recoveries] == [(5, [1], "transient")]
    steps = {x["step"]: x["signals"].get("grad_norm") for x in lines if x["type"] == "record" and x.get("kind") == "train"}
    assert sorted(steps) == [1, 2, 3, 4, 6, 7, 8, 9, 10]  # the held step is the recovery line, not a record
    assert all(isinstance(n, float) and n == n and n < float("inf") for n in steps.values())
    printed = [json.loads(x.replace("'", '"')) for x in proc.stdout.splitlines() if x.startswith("{'loss'")]
    assert [float(p["grad_norm"]) for p in printed if int(p["step"]) > 5] and \
        all(float(p["loss"]) == float(p["loss"]) for p in printed if int(p["step"]) > 5)  # finite: trained on


def test_recover_without_attach_is_a_usage_error(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "lossguard", "watch", "--recover", "--", "true"], env=ENV,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--recover needs --attach" in proc.stderr and "Traceback" not in proc.stderr
