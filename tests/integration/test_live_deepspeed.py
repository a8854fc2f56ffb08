"""Real two-rank raw DeepSpeed engines (CPU, gloo) guarded by `lossguard.attach`, one fault each."""

from __future__ import annotations

import json

import pytest

from tests.integration.live_helpers import above_info, run_job, runnable, scenario_params, signatures_at

pytestmark = pytest.mark.integration

FAULT_STEP = 4
FAULTS = {
    "z2-nan-bf16": ("nonfinite", FAULT_STEP),
    "z3-masked-one-rank": ("masked-labels", FAULT_STEP),
    "z1-fp16-storm": ("fp16-overflow", FAULT_STEP),
    "z2-lora-reentrant": ("no-grad-flow", 1),
    "z1-late-module": ("no-grad-flow", 1),
    "z0-desync": ("rank-desync", FAULT_STEP),  # nudged after step 4's update: seen at step 5
}
HEALTHY = ["z1-healthy", "z2-healthy-ga", "z3-healthy", "z2-healthy-lora", "z2-healthy-fp16"]


@pytest.fixture(scope="module")
def ds_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("ds")
    names = [h.values[0] if hasattr(h, "values") else h for h in HEALTHY]
    summaries, log = run_job("ds_job.py", out, runnable([*FAULTS, *names]))
    return out, summaries


@pytest.mark.parametrize("scenario", scenario_params(list(FAULTS)))
def test_fault_caught_and_halted_with_checkpoint(ds_runs, scenario):
    out, summaries = ds_runs
    signature, step = FAULTS[scenario]
    summary = summaries[scenario]
    assert signature in signatures_at(summary, step), summary["findings"]
    assert summary["halted_at"] in (step, step + 1)
    tag = f"lossguard-halt-step{summary['halted_at']}"
    if scenario.startswith("z0"):  # no ZeRO shards: the module state is saved whole
        import torch

        state = torch.load(out / scenario / "ckpt" / tag / "mp_rank_00_model_states.pt", weights_only=False)["module"]
    else:
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        state = get_fp32_state_dict_from_zero_checkpoint(str(out / scenario / "ckpt"), tag=tag)
    assert state  # a loadable checkpoint


@pytest.mark.parametrize("scenario", scenario_params(HEALTHY))
def test_healthy_runs_report_nothing_above_info(ds_runs, scenario):
    summary = ds_runs[1][scenario]
    assert above_info(summary) == []
    assert summary["halted_at"] is None and summary["global_step"] == 8


def test_a_rank_whose_events_disk_is_full_still_halts_with_the_others(tmp_path):
    """Rank 1 cannot write a byte of its events file (ENOSPC). Its sink switches off with one message; the
    analysis, and so the halt, stay the same on both ranks: neither rank trains on alone into a hang."""
    summaries, log = run_job("ds_job.py", tmp_path, ["z2-nan-bf16-disk-full"], timeout_s=300)
    ranks = [json.loads((tmp_path / "z2-nan-bf16-disk-full" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0] == ranks[1], ranks
    assert ranks[0]["halted_at"] in (FAULT_STEP, FAULT_STEP + 1) and not ranks[0]["disabled"]
    assert "events-rank1.jsonl" in log and "No space left on device" in log
    assert "nonfinite" in signatures_at(summaries["z2-nan-bf16-disk-full"], FAULT_STEP)


def test_a_rank_failing_after_the_halt_decision_still_halts_with_the_others(tmp_path):
    """Rank 1's parameter snapshot raises at the very step the guard decides to halt. The decision is made
    before that work, so both ranks halt together; before, rank 1 trained on alone and hung."""
    name = "z2-nan-bf16-snapshot-fails"
    summaries, log = run_job("ds_job.py", tmp_path, [name], timeout_s=300)
    ranks = [json.loads((tmp_path / name / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["halted_at"] == ranks[1]["halted_at"] == FAULT_STEP, ranks
    assert "injected snapshot failure" in (tmp_path / name / "events" / "events-rank1.jsonl").read_text() or \
        "injected snapshot failure" in log


def test_zero3_fingerprint_steps_gather_nothing(tmp_path):
    """Under ZeRO-3 every full parameter is re-gathered from the one fp32 master at each step, so ranks cannot
    disagree on it: the fingerprint leaves ZeRO-3 parameters out and does no collective. (It used to gather
    each parameter in turn on every fingerprint step: a full-model all-gather, a risk of running a rank out
    of memory on a big embedding, and, if one rank's arithmetic failed midway, a collective mismatch that
    killed the job.) Fingerprints every step here; the job must not enter `GatheredParameters` once."""
    name = "z3-healthy-count-gathers"
    summaries, _ = run_job("ds_job.py", tmp_path, [name], timeout_s=300)
    ranks = [json.loads((tmp_path / name / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["gathered_parameters_calls"] for r in ranks] == [0, 0]
    assert ranks[0]["global_step"] == ranks[1]["global_step"] == 8 and not ranks[0]["disabled"]
    assert above_info(summaries[name]) == []
    events = (tmp_path / name / "events" / "events-rank0.jsonl").read_text()
    assert '"raw_loss"' in events and "param_fingerprint" not in events
