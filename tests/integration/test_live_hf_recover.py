"""The commit gate inside `transformers.Trainer` (`LossguardCallback(recover=...)`): two real ranks over gloo,
under DeepSpeed ZeRO-1/2/3 and without DeepSpeed (DDP). A held step leaves each rank's state as it was (the
Trainer's LR scheduler included); under DeepSpeed a transient fault is replayed through the Trainer's own
training_step and the run ends bit-equal to a clean one, and a poisoned sample is quarantined and left out
of every later epoch; the budget falls back to the Trainer saving a checkpoint and stopping; a healthy run
trains and logs exactly as without lossguard; nothing hangs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")
pytest.importorskip("transformers")

from tests.integration.live_helpers import analyze_json, rank_outputs, run_job  # noqa: E402
from tests.integration.test_live_ds_recover import _same  # noqa: E402

pytestmark = pytest.mark.integration

NAN_STEP = 4
MARK = "==== hf_recover_job scenario"
HELD = ["z1-nan_once", "z2-nan_once", "z3-nan_once", "ddp-nan_once"]
SCENARIOS = [*HELD, "z2-over_budget", "ddp-over_budget", "z3-healthy", "z3-plain", "ddp-healthy", "ddp-plain",
             "z2-transient", "z2-plain", "z3-transient", "z1-transient", "z1-plain", "z2-poison", "z3-rollback",
             "z1-masked"]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    out = tmp_path_factory.mktemp("hf_recover")
    _, log = run_job("hf_recover_job.py", out, SCENARIOS, timeout_s=900)  # a hang fails here, at the timeout
    for name in SCENARIOS:  # the Trainer's own stdout of each scenario, beside its events dir, as a user keeps it
        stdout = log.split(f"{MARK} begin {name}\n", 1)[1].split(f"{MARK} end {name}", 1)[0]
        (out / name / "stdout.log").write_text(stdout)
    ranks = rank_outputs(out, SCENARIOS)
    summaries = {name: json.loads((out / name / "summary.json").read_text()) for name in SCENARIOS}
    return out, ranks, summaries


@pytest.mark.parametrize("scenario", HELD)
def test_a_faulty_step_is_held_on_every_rank_and_leaves_the_state_as_it_was(job, scenario):
    out, ranks, _ = job
    for rank in ranks[scenario]:
        assert rank["halted_at"] is None and rank["global_step"] == 8  # the Trainer counts the held step
    for r in (0, 1):
        before = torch.load(out / scenario / f"before-rank{r}.pt", weights_only=False)
        after = torch.load(out / scenario / f"after-rank{r}.pt", weights_only=False)
        before.pop("counters"), after.pop("counters")
        if not scenario.startswith("ddp"):  # DeepSpeed's optimizer says its last step was skipped
            assert before["optimizer"].pop("overflow") is False and after["optimizer"].pop("overflow") is True
        assert _same(before, after) >= 20  # weights, optimizer (Adam moments and step), both schedulers
    recoveries = analyze_json(out / scenario / "events")["recoveries"]
    assert [(r["step"], r["ranks"], r["kind"], r["signature"]) for r in recoveries] == \
        [(NAN_STEP, [1], "held", "nonfinite")]


@pytest.mark.parametrize("stack", ["z2", "ddp"])
def test_past_the_budget_the_trainer_saves_a_checkpoint_and_stops(job, stack):
    out, ranks, summaries = job
    name = f"{stack}-over_budget"
    for rank in ranks[name]:
        assert rank["halted_at"] == 5 and rank["global_step"] == 5
    assert "checkpoint-5" in summaries[name]["checkpoints"]
    report = analyze_json(out / name / "events")
    assert [r["step"] for r in report["recoveries"]] == [3, 4]
    assert report["verdict"] == "broken" and report["signature"] == "nonfinite"
    halt = next(x for x in (out / "hf_recover_job.py.log").read_text().splitlines()
                if x.startswith("lossguard: halting at step 5") and "budget" in x)  # said why, in one line
    assert "it recurred at steps 3, 4, 5, on rank(s) 1" in halt and "held without a replay" in halt


@pytest.mark.parametrize("stack", ["z3", "ddp"])
def test_a_healthy_run_with_recover_trains_and_logs_exactly_as_without_lossguard(job, stack):
    out, ranks, summaries = job
    guarded, plain = f"{stack}-healthy", f"{stack}-plain"
    for r in (0, 1):
        assert ranks[guarded][r]["losses"] == ranks[plain][r]["losses"]
    assert summaries[guarded]["logged"] == summaries[plain]["logged"] and len(summaries[plain]["logged"]) == 8
    report = analyze_json(out / guarded / "events")
    assert report["recoveries"] == [] and report["verdict"] == "healthy"


@pytest.mark.parametrize("stage", ["z1", "z2", "z3"])
def test_a_transient_fault_is_replayed_through_the_trainer_and_ends_bit_equal_to_a_clean_run(job, stage):
    out, ranks, summaries = job
    name, plain = f"{stage}-transient", f"{stage}-plain"
    for r in (0, 1):
        losses, clean = ranks[name][r]["losses"], ranks[plain][r]["losses"]
        assert losses[:NAN_STEP - 1] == clean[:NAN_STEP - 1] and losses[NAN_STEP:] == clean[NAN_STEP:]
        final = torch.load(out / name / f"final-rank{r}.pt", weights_only=False)
        assert _same(final, torch.load(out / plain / f"final-rank{r}.pt", weights_only=False)) > 10
    recoveries = analyze_json(out / name / "events")["recoveries"]
    assert [(r["step"], r["ranks"], r["kind"]) for r in recoveries] == [(NAN_STEP, [1], "transient")]


def test_a_poisoned_sample_is_quarantined_and_left_out_of_every_later_epoch(job):
    out, ranks, summaries = job
    recoveries = analyze_json(out / "z2-poison" / "events")["recoveries"]
    assert [r["kind"] for r in recoveries] == ["sample"] and len(recoveries[0]["samples"]) == 1
    # the sample reached the model in one step of three epochs: never again once it was named
    assert sum(rank["seen_poison"] for rank in ranks["z2-poison"]) == 3  # attempt, replay, its own scan forward
    assert all(rank["global_step"] == 12 and rank["halted_at"] is None for rank in ranks["z2-poison"])
    assert all(x == x for rank in ranks["z2-poison"] for i, x in enumerate(rank["losses"])
               if i + 1 != recoveries[0]["step"])


def test_nan_in_one_ranks_master_weights_is_rolled_back_under_the_trainer(job):
    out, ranks, _ = job
    recoveries = analyze_json(out / "z3-rollback" / "events")["recoveries"]
    assert [(r["step"], r["kind"], r["steps_lost"]) for r in recoveries] == [(7, "rollback", 3)]
    for r in (0, 1):
        assert ranks["z3-rollback"][r]["global_step"] == 8 and ranks["z3-rollback"][r]["halted_at"] is None
        final = torch.load(out / "z3-rollback" / f"final-rank{r}.pt", weights_only=False)
        assert all(torch.isfinite(p).all() for p in final)


def test_a_micro_batch_with_every_label_masked_is_quarantined_without_a_replay(job):
    out, ranks, _ = job
    (recovery,) = analyze_json(out / "z1-masked" / "events")["recoveries"]
    assert (recovery["step"], recovery["kind"], recovery["signature"], recovery["code"]) == \
        (NAN_STEP, "sample", "masked-labels", "LABEL001")
    assert [(e["rank"], e["position"]) for e in recovery["samples"]] == [(1, p) for p in range(4)]
    lines = (out / "z1-masked" / "events" / "events-rank0.jsonl").read_text().splitlines()
    assert not any('"replay"' in line for line in lines if '"recovery"' in line)  # no replay was run
    assert all(rank["global_step"] == 8 and rank["halted_at"] is None for rank in ranks["z1-masked"])


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_rank_made_the_same_collectives(job, scenario):
    """Held, replayed, scanned, rolled back or halted: every rank took the same collective path (counted at
    torch.distributed, DeepSpeed's and lossguard's alike), so no rank waits in one the others skipped."""
    ranks = job[1]
    first, second = (ranks[scenario][r]["collectives"] for r in (0, 1))
    assert first == second and sum(first.values()) > 0


@pytest.mark.parametrize("scenario", ["z2-transient", "ddp-nan_once"])
@pytest.mark.parametrize("log", ["stdout.log", "out/trainer_state.json"])
def test_a_recovered_runs_own_trainer_log_alone_knows_the_held_step_from_the_events_dir_beside_it(job, scenario, log):
    """The Trainer logs the held step's first attempt (its NaN filter counts rank 1's NaN as 0: half the
    loss; without DeepSpeed a NaN grad norm too). Read alone, the log takes the held steps from the events
    dir beside it: the step is left out, the run reads as recovered (warning), never broken or healthy."""
    out, _, summaries = job
    logged = summaries[scenario]["logged"]
    assert logged[NAN_STEP - 1] < 0.6 * logged[NAN_STEP - 2]  # the made-up value, as the Trainer logged it
    report = analyze_json(out / scenario / log)
    assert report["verdict"] == "warning" and report["signature"] is None
    assert [(r["step"], r["ranks"]) for r in report["recoveries"]] == [(NAN_STEP, [1])]
    assert report["stats"]["train_logs"] == 7  # eight steps, the held one not read as training
    assert [f["code"] for f in report["findings"] if f["severity"] != "info"] == ["REC001"]


@pytest.mark.parametrize("scenario", ["z3-healthy", "z3-plain", "ddp-healthy"])
@pytest.mark.parametrize("log", ["stdout.log", "out/trainer_state.json"])
def test_a_healthy_runs_own_trainer_log_stays_healthy_beside_its_events_dir(job, scenario, log):
    """The twin: the same reading of a healthy run's log (with the guard's events dir beside it, or none)."""
    out = job[0]
    report = analyze_json(out / scenario / log)
    assert report["verdict"] == "healthy" and report["recoveries"] == [] and report["stats"]["train_logs"] == 8


@pytest.mark.parametrize(("scenario", "flagged"), [("z2-transient", True), ("z2-plain", False), ("z3-healthy", False)])
@pytest.mark.parametrize("log", ["stdout.log", "out/trainer_state.json"])
def test_a_recovered_runs_log_alone_with_no_events_reads_the_made_up_loss_as_a_step_not_applied(
        job, tmp_path, scenario, flagged, log):
    """With no events dir beside it and no guard line in it, the held step's made-up loss (half: rank 1's NaN
    counted as 0) says a step was not applied: a warning, not a silent healthy; the twins stay healthy."""
    out = job[0]
    alone = tmp_path / Path(log).name
    alone.write_bytes((out / scenario / log).read_bytes())
    report = analyze_json(alone)
    codes = [(f["code"], f["step"]) for f in report["findings"] if f["severity"] != "info"]
    assert (report["verdict"], codes) == (("warning", [("REC002", NAN_STEP)]) if flagged else ("healthy", []))
    assert report["recoveries"] == []


def test_a_replay_that_raises_on_one_rank_holds_the_step_on_every_rank_without_a_hang(tmp_path, monkeypatch):
    """The Trainer under DeepSpeed ZeRO-2: the replay's forward (the Trainer's own `training_step`) raises on
    rank 1 alone (an out-of-memory error inside the model). The Trainer's backward is held back until the
    ranks agree: none runs it, every rank holds the step, the Trainer goes on, and both ranks made the same
    collectives. Run alone with a 20 s process-group timeout: without the agreement the job dies there."""
    monkeypatch.setenv("LOSSGUARD_TEST_PG_TIMEOUT_S", "20")
    run_job("hf_recover_job.py", tmp_path, ["z2-replay_oom"], timeout_s=300)
    ranks = rank_outputs(tmp_path, ["z2-replay_oom"])["z2-replay_oom"]
    assert [r["global_step"] for r in ranks] == [8, 8] and [r["halted_at"] for r in ranks] == [None, None]
    assert ranks[0]["collectives"] == ranks[1]["collectives"]
    recoveries = analyze_json(tmp_path / "z2-replay_oom" / "events")["recoveries"]
    assert [(e["step"], e["kind"], e["steps_lost"]) for e in recoveries] == [(4, "held", 1)]
    lines = [json.loads(line) for line in
             (tmp_path / "z2-replay_oom" / "events" / "events-rank0.jsonl").read_text().splitlines()]
    assert "out of memory" in next(line for line in lines if line["type"] == "recovery")["replay"]["errors"]["1"]
