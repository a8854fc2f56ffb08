"""Replay to classify (`recover=True` with `guard.batches` and `commit(forward=...)`) in a real two-rank DDP
loop over gloo: a transient fault leaves the run bit-equal to a clean one, a poisoned sample is named,
quarantined and never seen again (also after a resume), a fully masked micro-batch is quarantined without a
replay, nothing hangs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from tests.integration.live_helpers import SRC, run_job  # noqa: E402

SCENARIOS = ["clean", "transient", "poison", "resume", "all_bad", "masked"]
POISON_INDEX, MASKED = 13, [16, 18, 20, 22]


def _load(out, name: str, rank: int) -> dict:
    return json.loads((out / name / f"rank{rank}.json").read_text())


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    out = tmp_path_factory.mktemp("replay")
    run_job("replay_job.py", out, SCENARIOS, timeout_s=300)  # (d): a hang fails here, at the timeout
    return out, {name: [_load(out, name, r) for r in (0, 1)] for name in SCENARIOS}


def _recoveries(events_dir) -> list[dict]:
    proc = subprocess.run([sys.executable, "-m", "lossguard", "analyze", str(events_dir), "--format", "json"],
                          env={"PYTHONPATH": str(SRC)}, capture_output=True, text=True, timeout=120)
    return json.loads(proc.stdout)["recoveries"]


def _weights(out, name: str, rank: int) -> dict:
    return torch.load(out / name / f"final-rank{rank}.pt", weights_only=True)


def test_transient_fault_is_replayed_and_the_run_is_bit_equal_to_a_clean_one(job):
    out, ranks = job
    for rank in (0, 1):
        assert all(ranks["transient"][rank]["commits"]) and ranks["transient"][rank]["forward_calls"] == 1
        clean, replayed = _weights(out, "clean", rank), _weights(out, "transient", rank)
        for key, value in clean.items():  # dropout draws from the RNG: the replay restored it exactly
            assert torch.equal(value, replayed[key]), key
    [event] = _recoveries(out / "transient" / "events")
    assert (event["step"], event["kind"], event["ranks"], event["samples"], event["steps_lost"]) == \
        (4, "transient", [1], [], 0)
    assert _recoveries(out / "clean" / "events") == []


def test_poisoned_sample_is_named_quarantined_and_never_seen_again(job):
    out, ranks = job
    [event] = _recoveries(out / "poison" / "events")
    assert (event["step"], event["kind"], event["ranks"], event["steps_lost"]) == (2, "sample", [1], 0)
    [sample] = event["samples"]
    assert (sample["rank"], sample["position"], sample["index"]) == (1, 2, POISON_INDEX)
    assert len(sample["hash"]) == 16
    lines = (out / "poison" / "events" / "quarantine.jsonl").read_text().splitlines()
    assert [json.loads(line)["hash"] for line in lines] == [sample["hash"]]
    terminal = subprocess.run([sys.executable, "-m", "lossguard", "analyze", str(out / "poison" / "events")],
                              env={"PYTHONPATH": str(SRC), "COLUMNS": "400"}, capture_output=True, text=True,
                              timeout=120).stdout
    assert f"{sample['hash']} (index {POISON_INDEX})" in terminal
    seen = [i for rank in ranks["poison"] for step in rank["seen"] for i in step]
    assert seen.count(POISON_INDEX) == 1  # handed out once (step 2), quarantined, skipped in the second epoch
    for rank in (0, 1):
        assert all(ranks["poison"][rank]["commits"])
        weights = _weights(out, "poison", rank)
        assert all(torch.isfinite(v).all() for v in weights.values())
        assert torch.equal(weights["emb.weight"][15], torch.full((16,), 1e38))  # no committed step touched it


def test_a_new_guard_on_the_same_events_dir_skips_the_quarantined_sample(job):
    out, ranks = job
    assert all(POISON_INDEX not in step for rank in ranks["resume"] for step in rank["seen"])
    for rank in ranks["resume"]:
        assert all(rank["commits"]) and rank["forward_calls"] == 0
        assert all(loss == loss for loss in rank["losses"])  # finite: the poisoned token never ran
    # the resumed run recorded nothing new: the events dir holds the first run's one recovery
    assert [r["kind"] for r in _recoveries(out / "poison" / "events")] == ["sample"]


def test_a_fully_masked_micro_batch_is_quarantined_without_a_replay(job):
    out, ranks = job
    events = _recoveries(out / "masked" / "events")
    assert [(e["step"], e["kind"], e["ranks"], e["steps_lost"]) for e in events] == [(3, "sample", [0], 1)]
    # epoch 2: the batch is all quarantined: skipped on every rank, no second recovery
    lines = (out / "masked" / "events" / "events-rank1.jsonl").read_text().splitlines()
    assert [(e["step"], e["ranks"]) for e in map(json.loads, lines) if e["type"] == "skip"] == [(7, [0])]
    assert sorted(s["index"] for s in events[0]["samples"]) == MASKED
    assert all(r["forward_calls"] == 0 for r in ranks["masked"])  # no replay
    assert all(r["commits"] == [True, True, False, True, True, True, False, True] for r in ranks["masked"])
    lines = (out / "masked" / "events" / "quarantine.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["index"] for line in lines) == MASKED


def test_when_every_sample_fails_the_state_is_at_fault_and_the_step_is_held(job):
    out, ranks = job
    events = _recoveries(out / "all_bad" / "events")
    assert [(e["step"], e["kind"], e["ranks"], e["steps_lost"]) for e in events] == \
        [(2, "held", [1], 1), (6, "held", [1], 1)]
    assert len(events[0]["samples"]) == 4  # named in the record, but not quarantined
    assert not (out / "all_bad" / "events" / "quarantine.jsonl").exists()
    for rank in (0, 1):
        assert ranks["all_bad"][rank]["commits"] == [step not in (2, 6) for step in range(1, 9)]
        assert all(torch.isfinite(v).all() for v in _weights(out, "all_bad", rank).values())


def test_every_rank_made_the_same_collectives(job):
    _, ranks = job
    for name in SCENARIOS:
        assert ranks[name][0]["steps_by_path"] == ranks[name][1]["steps_by_path"], name


def test_a_replay_that_raises_on_one_rank_holds_the_step_on_every_rank_without_a_hang(tmp_path, monkeypatch):
    """The replay's forward raises on rank 1 alone (an out-of-memory error inside the model): rank 0's
    backward would all-reduce with a rank that never comes. The ranks agree before the backward: none runs
    it, every rank holds the step, the run goes on, and both made the same collectives. Run alone with a
    15 s process-group timeout: without the agreement the job dies at that timeout, not minutes later."""
    monkeypatch.setenv("LOSSGUARD_TEST_PG_TIMEOUT_S", "15")
    run_job("replay_job.py", tmp_path, ["replay_oom"], timeout_s=240)
    ranks = [_load(tmp_path, "replay_oom", r) for r in (0, 1)]
    for rank in (0, 1):
        assert ranks[rank]["commits"] == [step != 4 for step in range(1, 9)]
    assert ranks[0]["collectives"] == ranks[1]["collectives"]
    assert ranks[0]["steps_by_path"] == ranks[1]["steps_by_path"]
    events = _recoveries(tmp_path / "replay_oom" / "events")
    assert [(e["step"], e["kind"], e["ranks"], e["steps_lost"]) for e in events] == [(4, "held", [1], 1)]
    lines = [json.loads(line) for line in (tmp_path / "replay_oom" / "events" / "events-rank0.jsonl").read_text().splitlines()]
    line = next(line for line in lines if line["type"] == "recovery")
    assert "out of memory" in line["replay"]["errors"]["1"]
    assert line["action"].startswith("held: the replay or the per-sample scan failed")
    first, second = (_weights(tmp_path, "replay_oom", r) for r in (0, 1))
    assert all(torch.equal(first[k], second[k]) and torch.isfinite(first[k]).all() for k in first)
