"""The summary path over real collectives: two-rank raw DeepSpeed engines (CPU, gloo) with the world-size
threshold at 0, so each step all-reduces the summary and gathers only when it shows something. Fingerprints
are taken at steps 1 and 5 (the job's `-sum` scenarios) and compared in the summary: after the first step,
every step is summary-only unless a fault shows.
A fault on one rank must still be caught, named by its rank, and halt every rank at the same step."""

from __future__ import annotations

import json

import pytest

from tests.integration.live_helpers import above_info, run_job

pytestmark = pytest.mark.integration

FAULT_STEP = 4
SCENARIOS = ["z2-healthy-sum", "z3-masked-one-rank-sum", "z2-nan-bf16-sum", "z0-desync-sum"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("summary")
    summaries, _ = run_job("ds_job.py", out, SCENARIOS)
    ranks = {name: [json.loads((out / name / f"rank{r}.json").read_text()) for r in (0, 1)] for name in SCENARIOS}
    return out, summaries, ranks


def _findings(summary: dict, signature: str) -> list[dict]:
    return [f for f in summary["findings"] if f["signature"] == signature]


def test_healthy_run_is_quiet_and_most_steps_are_summary_only(runs):
    out, summaries, ranks = runs
    summary = summaries["z2-healthy-sum"]
    assert above_info(summary) == [] and summary["halted_at"] is None and summary["global_step"] == 8
    # step 1 gathers (the first step); the seven others, fingerprint step 5 included, are read from the
    # all_reduce alone
    assert [r["steps_by_path"] for r in ranks["z2-healthy-sum"]] == [{"detail": 1, "summary": 7}] * 2
    for rank in (0, 1):  # each rank's events file still holds its own record of every step
        lines = [json.loads(x) for x in (out / "z2-healthy-sum" / "events" / f"events-rank{rank}.jsonl").open()]
        steps = [x["step"] for x in lines if x.get("kind") == "train"]
        assert steps == list(range(1, 9)) and {x["rank"] for x in lines if x.get("kind") == "train"} == {rank}


def test_labels_masked_on_one_rank_are_caught_and_named_by_rank(runs):
    out, summaries, ranks = runs
    summary = summaries["z3-masked-one-rank-sum"]
    found = _findings(summary, "masked-labels")
    assert found and found[0]["step"] == FAULT_STEP and found[0]["rank"] == 1, summary["findings"]
    assert [r["halted_at"] for r in ranks["z3-masked-one-rank-sum"]] == [FAULT_STEP] * 2
    # steps 2 and 3 were summary-only: the zero label count in the summary made step 4 gather
    assert [r["steps_by_path"] for r in ranks["z3-masked-one-rank-sum"]] == [{"detail": 2, "summary": 2}] * 2
    from lossguard.api import analyze

    diagnosis = analyze([out / "z3-masked-one-rank-sum" / "events"])  # the events files alone say so too
    assert any(f.signature == "masked-labels" and f.rank == 1 for f in diagnosis.findings)


def test_nan_on_one_rank_halts_every_rank_at_the_same_step(runs):
    _, summaries, ranks = runs
    summary = summaries["z2-nan-bf16-sum"]
    assert [r["halted_at"] for r in ranks["z2-nan-bf16-sum"]] == [FAULT_STEP] * 2
    assert ranks["z2-nan-bf16-sum"][0] == ranks["z2-nan-bf16-sum"][1]  # the same decisions, the same path
    assert any(f["step"] == FAULT_STEP for f in _findings(summary, "nonfinite")), summary["findings"]
    assert ranks["z2-nan-bf16-sum"][0]["steps_by_path"] == {"detail": 2, "summary": 2}


def test_weights_drifting_on_one_rank_are_caught_by_the_fingerprint(runs):
    _, summaries, ranks = runs
    summary = summaries["z0-desync-sum"]
    found = _findings(summary, "rank-desync")
    # nudged after step 4's update, summary-only steps 2-4 see nothing; step 5's fingerprints differ
    assert found and found[0]["step"] == FAULT_STEP + 1 and found[0]["rank"] == 1, summary["findings"]
    assert [r["halted_at"] for r in ranks["z0-desync-sum"]] == [FAULT_STEP + 1] * 2
    assert ranks["z0-desync-sum"][0]["steps_by_path"] == {"detail": 2, "summary": 3}


def test_two_nodes_on_the_summary_path_catch_the_fault_on_the_other_node(tmp_path):
    """Multi-node launch (two torchrun agents, one rank each) under the HF Trainer, summary path forced: the
    zero label count of node 1's rank reaches node 0 through the all_reduce, both gather, both halt."""
    from tests.integration.live_helpers import run_job_two_nodes

    summaries, _ = run_job_two_nodes("hf_job.py", tmp_path, ["masked-one-rank-sum", "healthy-z1-sum"])
    fault = summaries["masked-one-rank-sum"]
    found = _findings(fault, "masked-labels")
    assert found and found[0]["step"] == FAULT_STEP and found[0]["rank"] == 1, fault["findings"]
    assert fault["halted_at"] in (FAULT_STEP, FAULT_STEP + 1) and fault["steps_by_path"]["summary"] >= 2
    healthy = summaries["healthy-z1-sum"]
    assert above_info(healthy) == [] and healthy["global_step"] == 8
    assert healthy["steps_by_path"] == {"detail": 1, "summary": 7}
