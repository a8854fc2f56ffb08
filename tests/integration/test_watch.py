"""`lossguard watch` over real two-rank jobs: a tiny GPT-2 trained for real on CPU with DeepSpeed (gloo),
launched by torchrun. A dying run is stopped within one logging interval of the first line that reveals
it; a healthy run runs to the end untouched. The signal and robustness cases use fake children
(test_watch_children.py)."""

from __future__ import annotations

import ast
import re
import socket
import sys
from pathlib import Path

import pytest

from .watch_helpers import JOBS_DIR, assert_no_orphans, report, run_watch

pytestmark = pytest.mark.integration

pytest.importorskip("deepspeed")
pytest.importorskip("transformers")

TORCHRUN = Path(sys.executable).with_name("torchrun")
STEP_SLEEP_S = 0.1  # a realistic step time (see tiny_train.py --step-sleep)
_DICT = re.compile(rb"\{'loss'[^}]*\}")


def torchrun(*job_args: str) -> list[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    launcher = [str(TORCHRUN)] if TORCHRUN.exists() else [sys.executable, "-m", "torch.distributed.run"]
    return [*launcher, "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", str(port),
            str(JOBS_DIR / "tiny_train.py"), *job_args]


def logged_steps(stdout: bytes) -> list[dict]:
    """The training logs the job printed, in order (HF dicts with a loss)."""
    return [ast.literal_eval(m.group().decode()) for m in _DICT.finditer(stdout)]


@pytest.fixture(autouse=True)
def _cpu_job_env(monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def test_masked_labels_trainer_run_is_stopped(tmp_path):
    """HF Trainer + ZeRO-2, every label -100: `{'loss': '0', 'grad_norm': '0'}` from the first log."""
    logging_steps = 2
    job = torchrun("trainer", "--masked", "--steps", "400", "--logging-steps", str(logging_steps),
                   "--step-sleep", str(STEP_SLEEP_S), "--out", str(tmp_path / "job"))
    result = run_watch("--halt-on", "broken", "--grace", "10", "--report", str(tmp_path / "r"), "--", *job,
                       timeout=300)
    assert result.returncode == 3, result.stderr[-3000:]
    data = report(tmp_path / "r")
    assert data["verdict"] == "broken" and data["signature"] == "masked-labels"
    assert data["causes"] and data["causes"][0]["fix"]
    watch = data["watch"]
    assert watch["halted"] and watch["signals"][0]["signal"] == "SIGINT"
    logs = logged_steps(result.stdout)
    # The first (0, 0) log already proves it (one log with loss and grad_norm exactly 0); at most one more
    # logging interval may have been printed before the stop landed.
    assert 1 <= len(logs) <= 2, logs
    assert all(log["loss"] == "0" and log["grad_norm"] == "0" for log in logs)
    assert b"lossguard: BROKEN" in result.stderr and b"masked-labels" in result.stderr
    assert_no_orphans(data)


def test_bf16_zero2_nan_run_is_stopped(tmp_path):
    """Raw DeepSpeed engine, bf16 ZeRO-2 with check_grad_overflow off; rank 1's loss is inf at step 5:
    grad_norm is inf from step 5 and every later loss is NaN (the weights are dead)."""
    inf_step = 5
    job = torchrun("raw", "--inf-step", str(inf_step), "--steps", "400", "--step-sleep", str(STEP_SLEEP_S))
    result = run_watch("--halt-on", "broken", "--grace", "10", "--report", str(tmp_path / "r"), "--", *job,
                       timeout=300)
    assert result.returncode == 3, result.stderr[-3000:]
    data = report(tmp_path / "r")
    assert data["verdict"] == "broken" and data["signature"] == "nonfinite"
    assert data["onset_step"] == inf_step
    logs = logged_steps(result.stdout)
    assert logs[inf_step - 1]["grad_norm"] == "inf"
    # The log carries no precision facts, and `grad_norm inf` next to a finite loss is also what a
    # skipped fp16 step prints; the next line (loss nan) is the revealing one. Onset stays at the fault.
    assert data["watch"]["halt_step"] in (inf_step, inf_step + 1)
    assert logs[-1]["step"] <= data["watch"]["halt_step"] + 1, logs  # one logging interval (one step here)
    assert_no_orphans(data)


def test_healthy_trainer_run_is_untouched(tmp_path):
    job = torchrun("trainer", "--steps", "16", "--logging-steps", "4", "--out", str(tmp_path / "job"))
    result = run_watch("-q", "--halt-on", "warning", "--report", str(tmp_path / "r"), "--", *job, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    data = report(tmp_path / "r")
    assert data["verdict"] == "healthy", data["findings"]
    assert data["watch"]["halted"] is False and data["watch"]["signals"] == []
    logs = logged_steps(result.stdout)
    assert len(logs) == 4 and float(logs[-1]["loss"]) < float(logs[0]["loss"])
    # -q: a healthy run shows only its own output. Not `b"lossguard" not in stderr`: the job's own warnings
    # carry file paths, and a checkout in a folder named lossguard put the word there (issue #24).
    assert not re.search(rb"^(?:\x1b\[[0-9;]*m)*(?:lossguard\b|stopped by lossguard)", result.stderr, re.M), \
        result.stderr[-2000:]
    # The log file is the job's output, line for line (stdout and stderr interleaved by whole lines).
    log = (tmp_path / "r" / "watch.log").read_bytes()
    assert len(log) == len(result.stdout) + len(result.stderr)
    assert sorted(log.splitlines()) == sorted(result.stdout.splitlines() + result.stderr.splitlines())
    assert_no_orphans(data)
