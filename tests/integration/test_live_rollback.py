"""Snapshots and rollback (`RecoverOptions(snapshot_every=S)`) in a real two-rank DDP loop over gloo: NaN
written into one rank's weights after a step is rolled back on both ranks, a healthy run with snapshots on
trains exactly as without lossguard, nothing hangs."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from tests.integration.live_helpers import analyze_json, rank_outputs, run_job  # noqa: E402

SCENARIOS = ["nan_weights", "lr_spike", "drift", "snap_healthy", "plain", "nan_default"]
NAN_STEP, EVERY, STEPS = 5, 3, 12


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    out = tmp_path_factory.mktemp("rollback")
    run_job("rollback_job.py", out, SCENARIOS, timeout_s=300)  # a hang fails here, at the timeout
    ranks = rank_outputs(out, SCENARIOS)
    return out, ranks


def test_nan_weights_roll_back_on_both_ranks_and_the_run_finishes(job):
    out, ranks = job
    fault = NAN_STEP + 1  # the NaN written after step 5 is first seen in step 6's forward
    for rank in ranks["nan_weights"]:
        assert rank["halted_at"] is None and rank["finite"]
        assert rank["commits"] == [step != fault for step in range(1, STEPS + 1)]
    a, b = (torch.load(out / "nan_weights" / f"rank{r}.pt") for r in (0, 1))
    for key in a:  # the replicas agree again after the rollback
        assert torch.equal(a[key], b[key]), key
    # snapshots at steps 1, 4 (state before step 4): the rollback to step 4 undoes steps 4, 5 and holds 6;
    # steps 7.. train on: 12 - 3 steps applied; the scheduler was restored with the optimizer
    assert ranks["nan_weights"][0]["scheduler"] == STEPS - 3
    recoveries = analyze_json(out / "nan_weights" / "events")["recoveries"]
    assert [(r["step"], r["kind"], r["ranks"], r["steps_lost"]) for r in recoveries] == [(fault, "rollback", [1], 3)]


def test_a_full_fine_tune_whose_ring_fits_rolls_back_by_default_with_its_scheduler_found(job):
    """`Guard(recover=True)` alone (no snapshot_every, no scheduler=): the ring of this full fine-tune fits, so
    snapshots are on every 10 steps; the NaN written after step 5 is rolled back to the snapshot before step 1
    on both ranks, and the LambdaLR bound to the optimizer, found at the first step, comes back with it: its
    count is the steps applied, and the LR the one it sets for that count."""
    out, ranks = job
    fault = NAN_STEP + 1
    for r, rank in enumerate(ranks["nan_default"]):
        assert rank["halted_at"] is None and rank["finite"]
        assert rank["commits"] == [step != fault for step in range(1, STEPS + 1)]
        assert rank["scheduler"] == STEPS - fault  # 1..5 undone, 6 held: 6 of 12 applied
        plans = [json.loads(line) for line in (out / "nan_default" / "events" / f"events-rank{r}.jsonl")
                 .read_text().splitlines() if '"snapshots"' in line]
        assert [(p["every"], p["asked"], p["fits"]) for p in plans] == [(10, None, True)]
    a, b = (torch.load(out / "nan_default" / f"rank{r}.pt") for r in (0, 1))
    assert all(torch.equal(a[key], b[key]) for key in a)
    (recovery,) = analyze_json(out / "nan_default" / "events")["recoveries"]
    assert (recovery["step"], recovery["kind"], recovery["ranks"], recovery["steps_lost"]) == (fault, "rollback", [1], fault)
    lines = [json.loads(line) for line in (out / "nan_default" / "events" / "events-rank0.jsonl").read_text().splitlines()]
    (rollback,) = [line for line in lines if line.get("kind") == "rollback"]
    assert rollback["restored"] == ["weights", "optimizer state and its LRs", "LR scheduler LambdaLR", "RNG"]
    log = (out / "rollback_job.py.log").read_text()
    said = [line for line in log.splitlines() if "lossguard: snapshots" in line]
    assert len(said) == 5, said  # one line per guarded scenario, from rank 0 alone
    (line,) = [text for text in said if "every 10 steps" in text]
    assert line.startswith("lossguard: snapshots every 10 steps, 2 x ") and \
        line.endswith("a rollback restores weights, optimizer, the LR scheduler LambdaLR (found), RNG"), line


def test_healthy_run_with_snapshots_logs_the_same_losses(job):
    _, ranks = job
    for r in (0, 1):
        assert ranks["snap_healthy"][r]["losses"] == ranks["plain"][r]["losses"]
        assert all(ranks["snap_healthy"][r]["commits"])


def test_a_loss_that_explodes_after_a_bad_step_and_again_on_replay_is_rolled_back(job):
    """One step at a 10^4x LR (every rank) leaves the weights finite but wrong: the loss at the next step is far
    above the run's spread and the replay of that batch says so again: held (one batch jumping is that
    batch's). The next batch jumps again on its replay too: two batches in a row, so the state is at fault,
    not the batches: every rank rolls back to the snapshot before the bad step and trains on at the normal LR."""
    out, ranks = job
    spike = 24
    recoveries = analyze_json(out / "lr_spike" / "events")["recoveries"]
    # snapshots before steps 22 and 25 (every 3): back to 22 (the one before 25 holds the bad step's weights):
    # 22, 23, 24 undone, 25 counted when held, 26 held
    assert [(r["step"], r["kind"], r["signature"], r["code"], r["steps_lost"]) for r in recoveries] == \
        [(spike + 1, "held", "loss-spike", "LOSS006", 1), (spike + 2, "rollback", "loss-spike", "LOSS006", 4)]
    for rank in ranks["lr_spike"]:
        assert rank["commits"] == [step not in (spike + 1, spike + 2) for step in range(1, 31)]
        assert rank["halted_at"] is None
        assert rank["finite"] and max(rank["losses"][spike + 2:]) < 2 * max(rank["losses"][:spike])


def test_a_drifted_replica_is_rolled_back_to_the_last_snapshot_every_rank_holds_alike(job):
    """Rank 1 nudges one weight after step 7: the fingerprints differ at step 8 (read before its update), the
    step is held, and every rank restores the snapshot taken before step 7, whose fingerprint every rank
    shares: the replicas agree again, bit for bit."""
    out, ranks = job
    recoveries = analyze_json(out / "drift" / "events")["recoveries"]
    assert [(r["step"], r["kind"], r["ranks"], r["signature"], r["code"], r["steps_lost"]) for r in recoveries] == \
        [(8, "rollback", [1], "rank-desync", "RANK001", 2)]
    a, b = (torch.load(out / "drift" / f"rank{r}.pt") for r in (0, 1))
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert all(rank["halted_at"] is None for rank in ranks["drift"])


def test_a_restore_that_fails_on_one_rank_halts_every_rank_together(tmp_path, monkeypatch):
    """Loading the optimizer's state raises on rank 1 alone during the rollback (an out-of-memory error):
    rank 0 restored the snapshot, rank 1 half of it, so no state is left that both can train on. The ranks
    agree after the restore: both halt at the held step (LossguardHalt, never rank 1's error alone into its
    loop while rank 0 trains on into the next exchange). Run alone with a 15 s process-group timeout."""
    monkeypatch.setenv("LOSSGUARD_TEST_PG_TIMEOUT_S", "15")
    run_job("rollback_job.py", tmp_path, ["restore_fails"], timeout_s=240)
    ranks = rank_outputs(tmp_path, ["restore_fails"])["restore_fails"]
    assert [r["halted_at"] for r in ranks] == [NAN_STEP + 1] * 2
    lines = [json.loads(line) for line in
             (tmp_path / "restore_fails" / "events" / "events-rank0.jsonl").read_text().splitlines()]
    halts = [line for line in lines if line["type"] == "halt"]
    assert [(h["step"], h["reason"]) for h in halts] == [(NAN_STEP + 1, "rollback-failed")]
    assert "out of memory" in halts[0]["errors"]["1"]
