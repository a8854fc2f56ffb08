"""Real two-rank Lightning DDP runs (CPU, gloo, torchrun) with LossguardLightningCallback: a healthy run, then
a NaN at step 4 on rank 1, caught, checkpointed and stopped on both ranks, which then exit with status 3."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lossguard.probe.launch import free_port
from tests.integration.live_helpers import JOBS, SRC, above_info

pytestmark = pytest.mark.integration
pytest.importorskip("lightning")
pytest.importorskip("transformers")

FAULT_STEP = 4
LR, CLIP = 1e-3, 0.05  # as in lightning_job.py


@pytest.fixture(scope="module")
def lightning_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("lightning")
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    torchrun = Path(sys.executable).parent / "torchrun"
    proc = subprocess.run([str(torchrun), "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port",
                           str(free_port()), str(JOBS / "lightning_job.py"), str(out), "healthy", "nan"],
                          env=env, capture_output=True, text=True, timeout=300)  # a hang fails here
    log = proc.stdout + proc.stderr
    (out / "lightning_job.log").write_text(log)
    ranks = {name: [json.loads((out / name / f"rank{r}.json").read_text()) for r in (0, 1)]
             for name in ("healthy", "nan")}
    return out, proc.returncode, ranks, log


def _train_records(path: Path) -> dict[int, dict]:
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    return {x["step"]: x["signals"] for x in lines if x.get("kind") == "train"}


def test_healthy_run_reports_nothing_above_info(lightning_runs):
    out, _, ranks, _ = lightning_runs
    for summary in ranks["healthy"]:
        assert above_info(summary) == [] and summary["halted_at"] is None and summary["global_step"] == 8
        assert summary["exit_code"] is None
    records = _train_records(out / "healthy" / "events" / "events-rank0.jsonl")
    assert sorted(records) == list(range(1, 9))
    for step, signals in records.items():
        assert signals["lr"] == pytest.approx(LR * step / 8)  # the LR the step used, not the next one
        assert signals["grad_norm"] > CLIP  # read before Lightning clipped it
        assert signals["num_label_tokens"] == 4 * 31  # labels found in the batch
    assert records[8]["raw_loss"] < records[1]["raw_loss"]  # it learns


def test_nan_caught_halted_checkpointed_on_every_rank(lightning_runs):
    out, _, ranks, _ = lightning_runs
    for summary in ranks["nan"]:
        found = {(f["signature"], f["step"]) for f in summary["findings"]}
        assert ("nonfinite", FAULT_STEP) in found, summary["findings"]
        # stopped at the halt step although min_steps=8: no step after it
        assert summary["halted_at"] == summary["global_step"] == FAULT_STEP
        assert summary["checkpoint"].endswith(f"lossguard-halt-step{FAULT_STEP}.ckpt")
    import torch

    checkpoint = torch.load(ranks["nan"][0]["checkpoint"], map_location="cpu", weights_only=False)
    assert checkpoint["global_step"] == FAULT_STEP
    for rank in (0, 1):
        lines = [json.loads(x) for x in (out / "nan" / "events" / f"events-rank{rank}.jsonl").read_text().splitlines()]
        assert {"type": "halt", "step": FAULT_STEP, "codes": ["LOSS001"]} in lines
        assert lines[-1]["type"] == "end" and lines[-1]["halted_at"] == FAULT_STEP


def test_exit_code_on_halt_ends_every_rank_and_torchrun_fails(lightning_runs):
    _, returncode, ranks, log = lightning_runs
    assert [summary["exit_code"] for summary in ranks["nan"]] == [3, 3]
    assert returncode != 0, log[-3000:]
    assert "exitcode  : 3" in log
    assert log.count("lossguard: exiting with status 3") == 1  # rank 0 says it
