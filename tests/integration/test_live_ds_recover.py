"""The commit gate under a raw DeepSpeed engine (`lossguard.attach(engine, recover=...)`): two real ranks over
gloo, ZeRO-1/2/3, fp32 and bf16. A held step leaves each rank's shard of the state bit for bit as it was; a
replayed transient fault ends bit-equal to a clean run; a poisoned sample is named, quarantined and never
seen again (also after a resume); the budget falls back to the halt with a checkpoint; a healthy run trains
exactly as without lossguard; the post-step signals (grad norm) still reach the events; nothing hangs."""

from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")

from tests.integration.live_helpers import (  # noqa: E402
    analyze_json,
    rank_outputs,
    run_job,
    runnable,
    scenario_params,
)

pytestmark = pytest.mark.integration

NAN_STEP = 4
# fp16 only where DeepSpeed's CPU accelerator supports it (skipped, saying why, elsewhere): the held step
# must leave the dynamic loss scale as it was, where a real overflow would halve it
HELD = ["z1-nan_once", "z2-nan_once-bf16", "z3-nan_once", "z2-masked", "z2-nan_once-fp16"]
REPLAYED = ["z2-transient", "z3-transient", "z2-poison", "z2-resume", "z3-poison", "z3-resume", "z2-flaky"]
ROLLED = ["z2-rollback", "z3-rollback", "z2-rollback_none", "z2-snap_healthy", "z2-lr_spike", "z1-drift"]
SCENARIOS = [*HELD, *REPLAYED, *ROLLED, "z3-over_budget", "z2-healthy", "z2-plain", "z3-plain", "z3-healthy-bf16",
             "z3-plain-bf16"]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    out = tmp_path_factory.mktemp("ds_recover")
    run_job("ds_recover_job.py", out, runnable(SCENARIOS), timeout_s=900)  # a hang fails here, at the timeout
    ranks = rank_outputs(out, runnable(SCENARIOS))
    return out, ranks



def _same(before, after, path="state") -> int:
    """Tensors compared bit for bit (dtype too), everything else by value; the number of tensors compared."""
    if isinstance(before, torch.Tensor):
        assert isinstance(after, torch.Tensor) and before.dtype == after.dtype and torch.equal(before, after), path
        return 1
    if isinstance(before, dict):
        assert before.keys() == after.keys(), path
        return sum(_same(before[k], after[k], f"{path}.{k}") for k in before)
    if isinstance(before, list):
        assert len(before) == len(after), path
        return sum(_same(b, a, f"{path}[{i}]") for i, (b, a) in enumerate(zip(before, after)))
    assert before == after, (path, before, after)
    return 0


@pytest.mark.parametrize("scenario", scenario_params(HELD))
def test_a_faulty_step_is_held_on_every_rank_and_leaves_each_shard_as_it_was(job, scenario):
    out, ranks = job
    for rank in ranks[scenario]:
        assert rank["held"] == [step == NAN_STEP for step in range(1, 9)] and rank["halted_at"] is None
        assert rank["skipped_steps"] == 0  # a held step is not counted as DeepSpeed's own overflow skip
    for r in (0, 1):
        before = torch.load(out / scenario / f"before-rank{r}.pt", weights_only=False)
        after = torch.load(out / scenario / f"after-rank{r}.pt", weights_only=False)
        (steps, samples, skipped), counters = before.pop("counters"), after.pop("counters")
        assert counters == [steps + 1, samples + 8, skipped]  # counted as a step DeepSpeed skipped, as it counts them
        # the optimizer says its last step was skipped, as after an overflow (accelerate reads it)
        assert before["optimizer"].pop("overflow") is False and after["optimizer"].pop("overflow") is True
        # weights (ZeRO-3: this rank's partition), fp32 master partition, Adam moments and step, scheduler
        assert _same(before, after) >= 20


def test_analyze_names_each_held_step_with_its_cause(job):
    out, _ = job
    report = analyze_json(out / "z3-nan_once" / "events")
    assert [(r["step"], r["ranks"], r["kind"], r["signature"]) for r in report["recoveries"]] == \
        [(NAN_STEP, [1], "held", "nonfinite")]
    assert report["verdict"] == "warning"  # a recovered run never reads as if nothing happened
    masked = analyze_json(out / "z2-masked" / "events")["recoveries"]
    assert [(r["step"], r["signature"], r["code"], r["kind"]) for r in masked] == \
        [(NAN_STEP, "masked-labels", "LABEL001", "sample")]  # quarantined without a replay: data by construction
    assert [(e["rank"], e["position"]) for e in masked[0]["samples"]] == [(1, p) for p in range(4)]


@pytest.mark.parametrize("stage", ["z2", "z3"])
def test_a_transient_fault_is_replayed_and_the_run_ends_bit_equal_to_a_clean_one(job, stage):
    out, ranks = job
    name, plain = f"{stage}-transient", f"{stage}-plain"
    for r in (0, 1):
        losses, clean = ranks[name][r]["losses"], ranks[plain][r]["losses"]
        assert losses[NAN_STEP:] == clean[NAN_STEP:] and losses[:NAN_STEP - 1] == clean[:NAN_STEP - 1]
        final = torch.load(out / name / f"final-rank{r}.pt", weights_only=False)
        assert _same(final, torch.load(out / plain / f"final-rank{r}.pt", weights_only=False)) > 10
        assert ranks[name][r]["global_steps"] == 8  # the replay's step is the one counted
    recoveries = analyze_json(out / name / "events")["recoveries"]
    assert [(r["step"], r["ranks"], r["kind"], r["steps_lost"]) for r in recoveries] == [(NAN_STEP, [1], "transient", 0)]


@pytest.mark.parametrize("stage", ["z2", "z3"])
def test_a_poisoned_sample_is_named_quarantined_and_never_seen_again(job, stage):
    out, ranks = job
    name = f"{stage}-poison"
    recoveries = analyze_json(out / name / "events")["recoveries"]
    assert [(r["step"], r["kind"], r["steps_lost"]) for r in recoveries] == [(NAN_STEP, "sample", 0)]
    (named,) = recoveries[0]["samples"]
    assert (named["rank"], named["position"], len(named["hash"])) == (1, 2, 16)
    lines = (out / name / "events" / "quarantine.jsonl").read_text().splitlines()
    assert [json.loads(line)["hash"] for line in lines] == [named["hash"]]
    for r in (0, 1):
        assert all(math.isfinite(x) for i, x in enumerate(ranks[name][r]["losses"]) if i != NAN_STEP - 1)
        final = torch.load(out / name / f"final-rank{r}.pt", weights_only=False)
        assert all(torch.isfinite(p).all() for p in final)  # the poisoned row is 1e38: finite, never used again
    assert ranks[name][1]["seen_poison"] == [int(s == NAN_STEP) for s in range(1, 9)]
    # a resume on the same events dir: `guard.batches` leaves the sample out before it reaches the model
    resumed = ranks[f"{stage}-resume"]
    assert resumed[1]["seen_poison"] == [0] * 8 and not any(resumed[1]["held"])
    assert analyze_json(out / f"{stage}-resume" / "events")["recoveries"] == []
    assert resumed[1]["losses"][NAN_STEP:] == ranks[name][1]["losses"][NAN_STEP:]


def test_committed_steps_keep_their_grad_norm_read_after_the_step(job):
    """The gate decides before `engine.step()`; the norm DeepSpeed computes inside it reaches the step's
    record one exchange later, on every committed step, the last one included (at detach)."""
    out, _ = job
    for scenario in ("z3-nan_once", "z2-healthy"):
        lines = [json.loads(line) for line in (out / scenario / "events" / "events-rank0.jsonl").read_text().splitlines()]
        norms = {line["step"]: line["signals"].get("grad_norm") for line in lines
                 if line.get("type") == "record" and line.get("kind", "train") == "train" and "signals" in line}
        committed = [s for s in range(1, 9) if not (scenario == "z3-nan_once" and s == NAN_STEP)]
        assert sorted(norms) == committed, norms
        assert all(isinstance(v, float) and v > 0 for v in norms.values()), norms


def test_past_the_budget_the_run_halts_with_a_checkpoint(job):
    out, ranks = job
    for rank in ranks["z3-over_budget"]:
        assert rank["held"] == [False, False, True, True] and rank["halted_at"] == 5
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    state = get_fp32_state_dict_from_zero_checkpoint(str(out / "z3-over_budget" / "ckpt"), tag="lossguard-halt-step5")
    assert state and all(torch.isfinite(v).all() for v in state.values())
    report = analyze_json(out / "z3-over_budget" / "events")
    assert [r["step"] for r in report["recoveries"]] == [3, 4]
    assert report["verdict"] == "broken" and report["signature"] == "nonfinite"


@pytest.mark.parametrize("stack", ["z2-{}", "z3-{}-bf16"])
def test_a_healthy_run_with_recover_trains_exactly_as_without_lossguard(job, stack):
    out, ranks = job
    guarded, plain = stack.format("healthy"), stack.format("plain")
    for r in (0, 1):
        assert ranks[guarded][r]["losses"] == ranks[plain][r]["losses"]
        assert not any(ranks[guarded][r]["held"])
    report = analyze_json(out / guarded / "events")
    assert report["recoveries"] == [] and report["verdict"] == "healthy"


def test_a_rank_whose_faults_keep_vanishing_on_replay_is_named_a_suspect_device(job):
    out, ranks = job
    recoveries = analyze_json(out / "z2-flaky" / "events")["recoveries"]
    assert [(r["step"], r["ranks"], r["kind"]) for r in recoveries] == [(3, [1], "transient"), (6, [1], "transient")]
    assert "suspect device" not in recoveries[0]["action"]
    assert "rank(s) 1 (2 times) faulted transiently" in recoveries[1]["action"]
    assert "suspect device" in recoveries[1]["action"]
    assert all(math.isfinite(x) for i, x in enumerate(ranks["z2-flaky"][1]["losses"]) if i + 1 not in (3, 6))


@pytest.mark.parametrize("stage", ["z2", "z3"])
def test_nan_in_one_ranks_master_weights_is_rolled_back_on_every_rank(job, stage):
    """NaN written into rank 1's fp32 master partition after step 5 reaches the 16-bit weights with step 6;
    the loss at 7 is held, every rank finds the weights non-finite and restores the snapshot taken before
    step 5, bit for bit (weights, fp32 master, Adam moments and step, scheduler), and trains on."""
    out, ranks = job
    name = f"{stage}-rollback"
    recoveries = analyze_json(out / name / "events")["recoveries"]
    assert [(r["step"], r["kind"], r["steps_lost"], r["signature"]) for r in recoveries] == \
        [(7, "rollback", 3, "nonfinite")]
    for r in (0, 1):
        rank = ranks[name][r]
        assert rank["halted_at"] is None and rank["global_steps"] == 8 and math.isfinite(rank["losses"][-1])
        rolled = torch.load(out / name / f"rolled-rank{r}.pt", weights_only=False)
        clean = torch.load(out / f"{stage}-plain" / f"at4-rank{r}.pt", weights_only=False)
        for state in (rolled, clean):
            state.pop("counters"), state["optimizer"].pop("overflow")
        assert _same(clean, rolled) > 10
        final = torch.load(out / name / f"final-rank{r}.pt", weights_only=False)
        assert all(torch.isfinite(p).all() for p in final)


def test_a_rollback_with_no_good_snapshot_halts_with_a_checkpoint(job):
    out, ranks = job
    for rank in ranks["z2-rollback_none"]:
        assert rank["halted_at"] == 7
    assert (out / "z2-rollback_none" / "ckpt" / "lossguard-halt-step7").is_dir()
    halts = [json.loads(line) for line in (out / "z2-rollback_none" / "events" / "events-rank0.jsonl").read_text()
             .splitlines() if '"halt"' in line]
    assert [(h["step"], h["reason"]) for h in halts] == [(7, "rollback-no-snapshot")]


def test_a_healthy_run_with_snapshots_trains_exactly_as_without_lossguard(job):
    _, ranks = job
    for r in (0, 1):
        assert ranks["z2-snap_healthy"][r]["losses"] == ranks["z2-plain"][r]["losses"]


def test_a_loss_that_explodes_after_a_bad_step_and_again_on_replay_is_rolled_back(job):
    out, ranks = job
    recoveries = analyze_json(out / "z2-lr_spike" / "events")["recoveries"]
    # 25 jumps again on its replay: held (one batch's); 26 too, another batch: the state's, rolled back
    assert [(r["step"], r["kind"], r["signature"], r["steps_lost"]) for r in recoveries] == \
        [(25, "held", "loss-spike", 1), (26, "rollback", "loss-spike", 4)]
    for rank in ranks["z2-lr_spike"]:
        assert rank["halted_at"] is None and rank["global_steps"] == 30
        assert max(rank["losses"][26:]) < 2 * max(rank["losses"][:24])  # trained on at the normal LR


def test_a_drifted_replica_is_rolled_back_under_zero(job):
    out, ranks = job
    recoveries = analyze_json(out / "z1-drift" / "events")["recoveries"]
    assert [(r["step"], r["kind"], r["ranks"], r["signature"], r["steps_lost"]) for r in recoveries] == \
        [(8, "rollback", [1], "rank-desync", 2)]
    finals = [torch.load(out / "z1-drift" / f"final-rank{r}.pt", weights_only=False) for r in (0, 1)]
    assert torch.equal(finals[0][0], finals[1][0])  # the 16-bit groups every replica holds agree again


@pytest.mark.parametrize("scenario", scenario_params(SCENARIOS))
def test_every_rank_made_the_same_collectives(job, scenario):
    """Held, replayed, scanned, rolled back or halted: every rank took the same collective path (counted at
    torch.distributed, DeepSpeed's and lossguard's alike), so no rank waits in one the others skipped."""
    ranks = job[1]
    first, second = (ranks[scenario][r]["collectives"] for r in (0, 1))
    assert first == second and sum(first.values()) > 0


def test_a_replay_that_raises_on_one_rank_holds_the_step_on_every_rank_without_a_hang(tmp_path, monkeypatch):
    """`attach`'s replay: the engine's forward raises on rank 1 alone (an out-of-memory error inside the
    model). The ranks agree before the engine's backward: none runs it, every rank holds the step, the run
    goes on, and both made the same collectives. Run alone with a 20 s process-group timeout: without the
    agreement the job dies at that timeout."""
    monkeypatch.setenv("LOSSGUARD_TEST_PG_TIMEOUT_S", "20")
    run_job("ds_recover_job.py", tmp_path, ["z2-replay_oom"], timeout_s=300)
    ranks = rank_outputs(tmp_path, ["z2-replay_oom"])["z2-replay_oom"]
    for rank in ranks:
        assert rank["held"] == [step == NAN_STEP for step in range(1, 9)] and rank["halted_at"] is None
    assert ranks[0]["collectives"] == ranks[1]["collectives"]
    recoveries = analyze_json(tmp_path / "z2-replay_oom" / "events")["recoveries"]
    assert [(e["step"], e["kind"], e["steps_lost"]) for e in recoveries] == [(NAN_STEP, "held", 1)]
    lines = [json.loads(line) for line in
             (tmp_path / "z2-replay_oom" / "events" / "events-rank0.jsonl").read_text().splitlines()]
    line = next(line for line in lines if line["type"] == "recovery")
    assert "out of memory" in line["replay"]["errors"]["1"]


def test_a_poisoned_sample_at_micro_batch_one_is_quarantined_and_skipped_next_epoch(tmp_path):
    """ZeRO-2, one sample a rank a step, two epochs of the same batches: rank 1's poisoned sample faults
    again on replay while rank 0's is finite, so it is the sample's fault (quarantined, the step held), not
    the state's; when it comes back its rank's batch is left empty and every rank skips that step through
    the step's exchange: no second recovery, the same collectives on both ranks, no halt."""
    run_job("ds_recover_job.py", tmp_path, ["z2-mb1poison"], timeout_s=300)
    ranks = rank_outputs(tmp_path, ["z2-mb1poison"])["z2-mb1poison"]
    [event] = analyze_json(tmp_path / "z2-mb1poison" / "events")["recoveries"]
    assert (event["step"], event["kind"], event["ranks"], event["steps_lost"]) == (4, "sample", [1], 1)
    [sample] = event["samples"]
    assert (sample["rank"], sample["position"]) == (1, 0)
    lines = (tmp_path / "z2-mb1poison" / "events" / "events-rank0.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines if json.loads(line)["type"] == "skip"] == [12]
    for rank in ranks:
        assert [step for step, held in enumerate(rank["held"], 1) if held] == [4, 12]
        assert rank["halted_at"] is None and rank["global_steps"] == 16
    assert sum(sum(rank["seen_poison"]) for rank in ranks) == 1  # never handed out again
    assert ranks[0]["collectives"] == ranks[1]["collectives"]
