"""Quarantine on the batch shapes real loops use, in a real two-rank DDP loop over gloo (quarantine_job.py):
at micro-batch 1 a poisoned sample is quarantined, not taken for bad state; a quarantined sample never runs
again, whatever the collator returns (a dict, a tuple, a `BatchEncoding` whose padding changes with its
batch-mates); a batch left empty is skipped on every rank alike, with no recovery and no budget; the healthy
twins train bit-equal to the same loop without lossguard, with no recovery event; nothing hangs."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.integration.live_helpers import analyze_json, rank_outputs, run_job  # noqa: E402

SCENARIOS = ["mb1_poison", "mb1_masked", "mb1_healthy", "mb1_plain", "tuple_poison", "enc_poison",
             "enc_healthy", "enc_plain"]
POISON_INDEX, MASKED_INDEX, STEPS_MB1, STEPS_ENC = 5, 6, 16, 8


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    out = tmp_path_factory.mktemp("quarantine")
    run_job("quarantine_job.py", out, SCENARIOS, timeout_s=300)  # a hang fails here, at the timeout
    return out, rank_outputs(out, SCENARIOS)


def _weights(out, name: str, rank: int) -> dict:
    return torch.load(out / name / f"final-rank{rank}.pt", weights_only=True)


def _lines(out, name: str, kind: str) -> list[dict]:
    lines = [json.loads(line) for r in (0, 1)
             for line in (out / name / "events" / f"events-rank{r}.jsonl").read_text().splitlines()]
    return [line for line in lines if line.get("type") == kind]


def _held_steps(ranks: list[dict]) -> list[int]:
    [steps] = {tuple(step + 1 for step, ok in enumerate(rank["commits"]) if not ok) for rank in ranks}
    return list(steps)  # the same on both ranks


@pytest.mark.parametrize("name", ["mb1_poison", "tuple_poison"])
def test_a_poisoned_sample_at_micro_batch_one_is_quarantined_not_halted(job, name):
    out, ranks = job
    [event] = analyze_json(out / name / "events")["recoveries"]
    assert (event["kind"], event["steps_lost"]) == ("sample", 1)  # its rank had nothing left: the step held
    [sample] = event["samples"]
    assert event["ranks"] == [sample["rank"]] and sample["position"] == 0
    assert sample["index"] == (POISON_INDEX if name == "mb1_poison" else None)  # a tuple: named by its tokens
    assert event["action"].startswith("sample: replayed, the fault came back")
    lines = (out / name / "events" / "quarantine.jsonl").read_text().splitlines()
    assert [json.loads(line)["hash"] for line in lines] == [sample["hash"]]
    # the second epoch: its rank's batch left empty, every rank skipped that step, no recovery, no budget
    [skip] = {(s["step"], tuple(s["ranks"])) for s in _lines(out, name, "skip")}
    assert _held_steps(ranks[name]) == [event["step"], skip[0]] and skip[0] > STEPS_MB1 // 2
    assert sum(rank["poison_seen"] for rank in ranks[name]) == 1  # it never ran again, not even as a stand-in
    for rank in (0, 1):
        assert len(ranks[name][rank]["commits"]) == STEPS_MB1
        assert all(torch.isfinite(v).all() for k, v in _weights(out, name, rank).items() if k != "emb.weight")
    assert ranks[name][0]["collectives"] == ranks[name][1]["collectives"]
    assert ranks[name][0]["steps_by_path"] == ranks[name][1]["steps_by_path"]


def test_a_quarantined_fully_masked_sample_is_skipped_next_epoch_not_held_again(job):
    out, ranks = job
    [event] = analyze_json(out / "mb1_masked" / "events")["recoveries"]
    assert (event["kind"], event["steps_lost"]) == ("sample", 1)
    assert [s["index"] for s in event["samples"]] == [MASKED_INDEX]
    [skip] = {s["step"] for s in _lines(out, "mb1_masked", "skip")}
    assert _held_steps(ranks["mb1_masked"]) == [event["step"], skip]
    seen = [i for rank in ranks["mb1_masked"] for step in rank["seen"] for i in step]
    assert seen.count(MASKED_INDEX) == 1  # handed out once; the stand-in in its place the second time


def test_a_batch_encoding_sheds_a_sample_whose_padding_changed_and_stays_a_batch_encoding(job):
    out, ranks = job
    [event] = analyze_json(out / "enc_poison" / "events")["recoveries"]
    assert (event["kind"], event["steps_lost"]) == ("sample", 0)  # its batch-mate committed
    [sample] = event["samples"]
    assert sample["index"] is None  # a collator's BatchEncoding carries no index: named by its tokens
    # seed 3: padded to its first-epoch batch-mate's length, unpadded beside its second-epoch one; never
    # handed out again, and no batch was left empty
    assert sum(rank["poison_seen"] for rank in ranks["enc_poison"]) == 1
    assert _held_steps(ranks["enc_poison"]) == [] and _lines(out, "enc_poison", "skip") == []
    for rank in ranks["enc_poison"]:
        assert set(rank["types"]) == {"BatchEncoding"} and len(rank["commits"]) == STEPS_ENC


@pytest.mark.parametrize("shape", ["mb1", "enc"])
def test_healthy_unusual_runs_train_bit_equal_with_recover_and_record_nothing(job, shape):
    out, ranks = job
    healthy, plain = f"{shape}_healthy", f"{shape}_plain"
    for rank in (0, 1):
        assert all(ranks[healthy][rank]["commits"])
        assert ranks[healthy][rank]["losses"] == ranks[plain][rank]["losses"]
        with_guard, without = _weights(out, healthy, rank), _weights(out, plain, rank)
        for key, value in without.items():  # dropout draws from the RNG: the guard drew nothing
            assert torch.equal(value, with_guard[key]), key
    report = analyze_json(out / healthy / "events")
    assert report["recoveries"] == [] and _lines(out, healthy, "skip") == []
    assert not (out / healthy / "events" / "quarantine.jsonl").exists()
