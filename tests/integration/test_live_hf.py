"""Real two-rank Trainer + DeepSpeed runs (CPU, gloo) with LossguardCallback, one fault each."""

from __future__ import annotations

import json

import pytest

from tests.integration.live_helpers import above_info, run_job, runnable, scenario_params, signatures_at

pytestmark = pytest.mark.integration

FAULT_STEP = 4
# scenario -> (expected signature, step where the fault first acts)
FAULTS = {
    "nan-bf16": ("nonfinite", FAULT_STEP),  # bf16 ZeRO-2, check_grad_overflow false, inf loss on rank 1
    "masked-one-rank": ("masked-labels", FAULT_STEP),  # rank 1's labels all -100 from step 4
    "fp16-storm": ("fp16-overflow", FAULT_STEP),  # fp16 activations x1e6 from step 4
    "lora-reentrant": ("no-grad-flow", 1),  # LoRA + reentrant checkpointing, no input grads
    "late-module": ("no-grad-flow", 1),  # a module added after the optimizer was built
    "desync": ("rank-desync", FAULT_STEP - 1),  # rank 1's weights nudged after step 3
}
HEALTHY = ["healthy-z1", "healthy-z3", "healthy-ga", "healthy-fp16", "healthy-lora"]


@pytest.fixture(scope="module")
def hf_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("hf")
    summaries, log = run_job("hf_job.py", out, runnable([*FAULTS, *HEALTHY, "internal-error"]))
    return out, summaries, log


@pytest.mark.parametrize("scenario", scenario_params(list(FAULTS)))
def test_fault_caught_and_halted_with_checkpoint(hf_runs, scenario):
    out, summaries, _ = hf_runs
    signature, step = FAULTS[scenario]
    summary = summaries[scenario]
    assert signature in signatures_at(summary, step), summary["findings"]
    assert summary["halted_at"] in (step, step + 1)
    assert summary["global_step"] == summary["halted_at"]  # the Trainer stopped at the halt step
    checkpoint = out / scenario / "out" / f"checkpoint-{summary['halted_at']}"
    assert (checkpoint / "trainer_state.json").exists()
    if scenario.startswith("lora"):
        assert (checkpoint / "adapter_model.safetensors").exists()
    else:
        from transformers import GPT2LMHeadModel

        GPT2LMHeadModel.from_pretrained(checkpoint)  # loadable


@pytest.mark.parametrize("scenario", scenario_params(HEALTHY))
def test_healthy_runs_report_nothing_above_info(hf_runs, scenario):
    summary = hf_runs[1][scenario]
    assert above_info(summary) == []
    assert summary["halted_at"] is None and summary["global_step"] == 8


def test_internal_error_reported_once_and_training_continues(hf_runs):
    out, summaries, log = hf_runs
    summary = summaries["internal-error"]
    assert summary["disabled"] is True and summary["global_step"] == 8
    assert log.count("lossguard: internal error") == 1
    lines = [json.loads(x) for x in (out / "internal-error" / "events" / "events-rank1.jsonl").read_text().splitlines()]
    assert any(x.get("event") == "internal-error" for x in lines)


def test_events_replay_through_analyze(hf_runs):
    from lossguard.core.engine import Engine
    from lossguard.detectors import make_detectors
    from lossguard.sources import discover, records

    out = hf_runs[0]
    engine = Engine(make_detectors())
    engine.feed_all(records(discover([str(out / "masked-one-rank" / "events")])))
    result = engine.finish()
    assert any(f.signature == "masked-labels" and f.step == FAULT_STEP for f in result.findings)


def test_two_nodes_one_rank_each_catch_the_fault_on_the_other_node(tmp_path):
    """Multi-node: the fault is on node 1's only rank; node 0 (which prints) halts at the same step."""
    from tests.integration.live_helpers import run_job_two_nodes

    summaries, _ = run_job_two_nodes("hf_job.py", tmp_path, ["masked-one-rank", "healthy-z1"])
    fault = summaries["masked-one-rank"]
    assert "masked-labels" in signatures_at(fault, FAULT_STEP)
    assert fault["halted_at"] in (FAULT_STEP, FAULT_STEP + 1)
    assert above_info(summaries["healthy-z1"]) == []
