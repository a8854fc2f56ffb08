"""The live guard records the Trainer's own numbers, and says what the data shows.

Real two-rank Trainer runs (DDP over gloo, and DeepSpeed ZeRO-2 on CPU), `logging_steps=1`: at every
logged step the guard's records hold the loss, grad_norm and learning_rate the Trainer logged, to float32
rounding (see live_jobs/numbers_job.py for why each differs from a naive reading: gradient accumulation,
clipping that bites, a warmup from 0, GPT-2's token count). And a real accelerate loop on random tokens,
guarded by `Guard`: the flat loss is flagged, with the weights measured as updated, so the reason is
"nothing to learn", not "the weights are not being updated"."""

from __future__ import annotations

import json
import math

import pytest

from tests.integration.live_helpers import run_job

pytestmark = pytest.mark.integration

SCENARIOS = ["plain", "zero2"]


@pytest.fixture(scope="module")
def number_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("numbers")
    summaries, _ = run_job("numbers_job.py", out, SCENARIOS)
    return out, summaries


def train_records(events_dir, rank: int) -> dict[int, dict]:
    lines = [json.loads(x) for x in (events_dir / f"events-rank{rank}.jsonl").read_text().splitlines()]
    return {x["step"]: x["signals"] for x in lines if x.get("kind") == "train"}


def same(logged: float, ours: float) -> bool:
    """Equal to float32 rounding (the Trainer's values are float32 tensors read with .item()); a value the
    Trainer rounded to 4 decimals (some 4.x versions round the loss) to that rounding."""
    if math.isclose(logged, ours, rel_tol=2e-6, abs_tol=1e-12):
        return True
    return logged == round(logged, 4) and abs(logged - ours) <= 5e-5 + 1e-12


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_guard_records_the_numbers_the_trainer_logs(number_runs, scenario):
    out, summaries = number_runs
    logs = [h for h in summaries[scenario]["log_history"] if "loss" in h and "step" in h]
    assert [h["step"] for h in logs] == list(range(1, 9))
    ranks = [train_records(out / scenario / "events", rank) for rank in (0, 1)]
    clipped = 0
    for h in logs:
        mine = [r[h["step"]] for r in ranks]
        # the Trainer logs the mean of the ranks' losses (every rank holds as many tokens here)
        loss = sum(s["raw_loss"] for s in mine) / len(mine)
        assert same(h["loss"], loss), (h, [s["raw_loss"] for s in mine])
        for s in mine:  # grad norm and LR are the run's: every rank holds the Trainer's value
            assert same(h["grad_norm"], s["grad_norm"]), (h, s)
            assert math.isclose(h["learning_rate"], s["lr"], rel_tol=1e-9, abs_tol=1e-15), (h, s)
        clipped += h["grad_norm"] > 0.05  # max_grad_norm: the norm after clipping would be 0.05
    assert clipped == len(logs)  # the norm is the one before clipping at every step
    assert logs[0]["learning_rate"] == 0.0  # the LR the first step used (warmup from 0), not the next one's


@pytest.fixture(scope="module")
def random_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("random")
    summaries, _ = run_job("random_job.py", out, ["random"])
    return out, summaries["random"]


def test_a_flat_loss_with_updated_weights_is_nothing_to_learn(random_run):
    out, summary = random_run
    flat = [f for f in summary["findings"] if f["code"] == "LOSS004"]
    assert len(flat) == 1, summary["findings"]
    finding = flat[0]
    assert finding["signature"] == "not-learning" and finding["severity"] == "error"
    assert finding["data"]["weights_updated"] == 1
    assert "although the weights are being updated" in finding["message"]
    assert "not being updated" not in finding["message"]
    # the reason agrees with the records: the guard measured the weights moving on every rank
    for rank in (0, 1):
        ratios = [s["update_ratio"] for s in train_records(out / "random" / "events", rank).values()
                  if "update_ratio" in s]
        assert ratios and min(ratios) > 0, ratios
    assert finding["data"]["max_update_ratio"] > 0
