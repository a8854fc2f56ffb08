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
from tests.integration.live_helpers import JOBS, SRC, above_info, analyze_json

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


@pytest.fixture(scope="module")
def recover_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("lightning_recover")
    scenarios = ["recover", "recover_healthy", "plain", "fp16_plain", "fp16_guard", "fp16_recover"]
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    torchrun = Path(sys.executable).parent / "torchrun"
    proc = subprocess.run([str(torchrun), "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port",
                           str(free_port()), str(JOBS / "lightning_job.py"), str(out), *scenarios],
                          env=env, capture_output=True, text=True, timeout=300)  # a hang fails here
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return out, {name: [json.loads((out / name / f"rank{r}.json").read_text()) for r in (0, 1)]
                 for name in scenarios}


def test_recover_holds_a_nan_step_on_both_ranks_and_leaves_the_state_as_it_was(recover_runs):
    import torch

    out, ranks = recover_runs
    for rank in ranks["recover"]:
        assert rank["halted_at"] is None and rank["global_step"] == 8  # Lightning counts the held step
    for r in (0, 1):
        before = torch.load(out / "recover" / f"before-rank{r}.pt", weights_only=False)
        after = torch.load(out / "recover" / f"after-rank{r}.pt", weights_only=False)
        for key, value in before["model"].items():
            assert torch.equal(value, after["model"][key]), key
        assert before["scheduler"] == after["scheduler"]  # the step-interval scheduler did not step
        old, new = before["optimizer"]["state"], after["optimizer"]["state"]
        assert old.keys() == new.keys() and old
        for index, moments in old.items():  # AdamW's moments and step count, bit for bit
            for name, value in moments.items():
                assert torch.equal(value, new[index][name]), (index, name)
    lines = [json.loads(x) for x in (out / "recover" / "events" / "events-rank0.jsonl").read_text().splitlines()]
    recoveries = [x for x in lines if x["type"] == "recovery"]
    assert [(x["step"], x["ranks"], x["kind"], x["signature"]) for x in recoveries] == \
        [(FAULT_STEP, [1], "held", "nonfinite")]


def test_recover_on_a_healthy_run_trains_exactly_as_without_lossguard(recover_runs):
    _, ranks = recover_runs
    for r in (0, 1):
        assert ranks["recover_healthy"][r]["losses"] == ranks["plain"][r]["losses"]
        assert len(ranks["plain"][r]["losses"]) == 8
    assert all(rank["halted_at"] is None for rank in ranks["recover_healthy"])


def test_fp16_start_up_overflows_are_the_scalers_business(recover_runs):
    """16-mixed with a GradScaler that starts at 2^24: its first steps overflow (it skips them and halves its
    scale), more of them than the recovery budget. Guarded (halt_on="warning") and with recover=True the run
    trains exactly as without lossguard: no finding, no held step, no halt, bit-equal weights (before the
    fix: LOSS001 halted the guarded run at step 1 and the recover run at step 4)."""
    import torch

    out, ranks = recover_runs
    scales = ranks["fp16_plain"][0]["scales"]
    assert sum(1 for before, after in zip(scales, scales[1:]) if after < before) >= 3
    for name in ("fp16_guard", "fp16_recover"):
        for r, rank in enumerate(ranks[name]):
            plain = ranks["fp16_plain"][r]
            assert rank["halted_at"] is None and rank["global_step"] == 8, name
            assert rank["losses"] == plain["losses"] and rank["scales"] == plain["scales"], name
            assert above_info(rank) == [], name
            mine = torch.load(out / name / f"weights-rank{r}.pt")
            theirs = torch.load(out / "fp16_plain" / f"weights-rank{r}.pt")
            assert all(torch.equal(mine[key], theirs[key]) for key in theirs), name
        lines = (out / name / "events" / "events-rank0.jsonl").read_text().splitlines()
        assert not [x for x in map(json.loads, lines) if x["type"] in ("recovery", "halt")], name


def test_a_recovered_runs_metrics_csv_alone_knows_the_held_step_from_the_events_dir_beside_it(recover_runs):
    """Lightning logs the held step's loss as the ranks' mean: NaN (metrics.csv numbers it 3, the guard 4).
    Read alone, metrics.csv takes the held step from the run's events dir: a warning with the recovery,
    not a NaN death; the twins (recover=True without a fault, no guard) read healthy."""
    out, _ = recover_runs
    rows = (out / "recover" / "csv" / "version_0" / "metrics.csv").read_text().splitlines()
    assert rows[4].endswith(",3,nan")  # the made-up value of the held step, as Lightning wrote it
    report = analyze_json(out / "recover" / "csv" / "version_0" / "metrics.csv")
    assert report["verdict"] == "warning" and report["signature"] is None
    assert [(r["step"], r["kind"]) for r in report["recoveries"]] == [(4, "held")]
    assert report["stats"]["train_logs"] == 7
    for twin in ("recover_healthy", "plain"):
        report = analyze_json(out / twin / "csv" / "version_0" / "metrics.csv")
        assert report["verdict"] == "healthy" and report["recoveries"] == [] and report["stats"]["train_logs"] == 8
