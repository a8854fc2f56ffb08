"""`lossguard watch --attach --recover`: the guard attached inside an unmodified two-rank raw DeepSpeed job
(bf16 ZeRO-2, `check_grad_overflow: false`, one infinite loss on the last rank at step 5, which without
recovery writes NaN into the weights) holds that step, replays it, and the job trains on to the end. Under
the Trainer with `--halt-on broken`, watch reads the guard's recovered line and leaves the held step's
made-up loss out: the run finishes, and reads as recovered (warning), not healthy, not broken."""

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


def _watch(out: Path, *flags: str, job: tuple[str, ...] = ("raw", "--steps", "10", "--inf-step", "5")) \
        -> subprocess.CompletedProcess:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    launcher = [str(TORCHRUN)] if TORCHRUN.exists() else [sys.executable, "-m", "torch.distributed.run"]
    return subprocess.run([sys.executable, "-m", "lossguard", "watch", *flags, "--report", str(out), "--",
                           *launcher, "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port",
                           str(port), str(JOBS_DIR / "tiny_train.py"), *job, "--out", str(out / "job")],
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


def test_halt_on_broken_finishes_a_run_the_guard_recovered_and_reads_it_as_recovered(tmp_path):
    """The Trainer (ZeRO-2) logs the held step's first attempt through its NaN filter (rank 1's NaN counted as
    0: half the loss); the guard's recovered line comes first in the output, and watch honours it."""
    proc = _watch(tmp_path, "--attach", "--recover", "--halt-on", "broken",
                  job=("trainer", "--nan-once", "--inf-step", "5", "--steps", "12"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "lossguard: recovered at step 5" in proc.stderr
    losses = [float(json.loads(x.replace("'", '"'))["loss"]) for x in proc.stdout.splitlines() if x.startswith("{'loss'")]
    assert len(losses) == 12 and losses[4] < 0.6 * losses[3]  # the made-up value the Trainer logged for step 5
    report = json.loads((tmp_path / "report.json").read_text())
    assert not report["watch"]["halted"] and report["verdict"] == "warning"
    assert [(r["step"], r["ranks"], r["kind"]) for r in report["recoveries"]] == [(5, [1], "transient")]
    assert report["stats"]["train_logs"] == 11  # the held step's attempt is not read as training
    assert [f["code"] for f in report["findings"] if f["severity"] != "info"] == ["REC001"]


def test_recover_without_attach_is_a_usage_error(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "lossguard", "watch", "--recover", "--", "true"], env=ENV,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--recover needs --attach" in proc.stderr and "Traceback" not in proc.stderr
