"""The live guard on PyTorch FSDP (issue 33), in real two-rank runs over gloo on CPU (live_jobs/fsdp_job.py):
FSDP2 (`fully_shard`, DTensor parameters) and FSDP1 (`FullyShardedDataParallel`, flat parameters, with
`use_orig_params` false and true). A guarded healthy run trains exactly as without the guard and reports
FSDP's own gradient norm; an injected NaN (in one rank's loss, or in one element of one rank's gradient
shard) is caught at that step on every rank; every rank makes the same collectives (the job runs with
TORCH_DISTRIBUTED_DEBUG=DETAIL, which fails it at the first collective that differs), and the guard adds
only its one exchange a step; with `recover`, FSDP2 runs snapshot each rank's own shards: a healthy run trains
bit-equal to one without lossguard, and NaN weights on one rank's shard roll every rank back to the same
snapshot, its shards restored bit-equal (FSDP1 says snapshots are off); `lossguard analyze` reads the events back with the sharding engine. The Lightning
callback is run under `ModelParallelStrategy` (FSDP2). Not run here, and why: Lightning's `FSDPStrategy` (FSDP1)
refuses a CPU accelerator, and the HF Trainer's `fsdp` does not shard on CPU (accelerate runs it as MULTI_CPU
data parallelism), so `LossguardCallback` on FSDP needs a machine with GPUs."""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("torch")

from tests.integration.live_helpers import analyze_json, rank_outputs, run_job  # noqa: E402

ENGINES = ["fsdp2", "fsdp1", "fsdp1orig"]
SCENARIOS = [f"{engine}-{arm}" for engine in ENGINES for arm in ("plain", "guard")] + \
    ["fsdp2-nan", "fsdp2-gradnan", "fsdp2-holdnan", "fsdp2-recover", "fsdp2-rollnan", "fsdp2-unused",
     "fsdp1-nan", "fsdp1-recover", "fsdp1orig-gradnan"]
STEPS, NAN_STEP, ROLL_STEP, SNAPSHOT_EVERY = 8, 3, 4, 2  # fsdp_job.py


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp")
    _, log = run_job("fsdp_job.py", out, SCENARIOS, timeout_s=300)
    return out, rank_outputs(out, SCENARIOS), log


def _lines(out, name: str, rank: int) -> list[dict]:
    return [json.loads(line) for line in (out / name / "events" / f"events-rank{rank}.jsonl").read_text().splitlines()]


def _train(out, name: str, rank: int) -> list[dict]:
    return [line for line in _lines(out, name, rank) if line.get("kind") == "train" and line["rank"] == rank]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_guarded_healthy_run_trains_as_without_the_guard_and_reports_fsdps_own_norm(job, engine):
    out, ranks, _ = job
    for rank, (mine, plain) in enumerate(zip(ranks[f"{engine}-guard"], ranks[f"{engine}-plain"], strict=True)):
        assert mine["losses"] == plain["losses"] and mine["norms"] == plain["norms"]
        assert mine["halted_at"] is None
        records = _train(out, f"{engine}-guard", rank)
        assert [r["step"] for r in records] == list(range(1, STEPS + 1))
        # the norm the guard folded from both ranks' shards is the one FSDP's clip_grad_norm_ computed
        assert [r["signals"]["grad_norm"] for r in records] == pytest.approx(mine["norms"], rel=1e-6)
        # shards are no replicas: no fingerprint; the update ratio is each rank's own shard's
        assert all("param_fingerprint" not in r["signals"] for r in records)
        assert all(r["signals"]["update_ratio"] > 0 for r in records if "update_ratio" in r["signals"])
        assert sum("update_ratio" in r["signals"] for r in records) >= STEPS // 2
    summary = json.loads((out / f"{engine}-guard" / "summary.json").read_text())
    assert [f for f in summary["findings"] if f["severity"] != "info"] == []


@pytest.mark.parametrize("name", ["fsdp2-nan", "fsdp2-gradnan", "fsdp1-nan", "fsdp1orig-gradnan"])
def test_an_injected_nan_is_caught_at_its_step_on_every_rank(job, name):
    """`nan`: rank 1's loss; `gradnan`: one element of rank 1's own gradient shard, the loss finite on both
    ranks (only the norm folded from both shards shows it to rank 0)."""
    out, ranks, _ = job
    assert [r["halted_at"] for r in ranks[name]] == [NAN_STEP, NAN_STEP]
    assert all(len(r["losses"]) == NAN_STEP for r in ranks[name])
    if "gradnan" in name:
        assert all(math.isfinite(loss) for r in ranks[name] for loss in r["losses"])
    for rank in (0, 1):
        halts = [line for line in _lines(out, name, rank) if line["type"] == "halt"]
        assert [(h["step"], h["codes"]) for h in halts] == [(NAN_STEP, ["LOSS001"])]
        assert math.isnan(float(_train(out, name, rank)[-1]["signals"]["grad_norm"]))  # written as "nan"


def test_recover_holds_the_nan_step_on_every_rank_and_trains_on(job):
    out, ranks, log = job
    for mine in ranks["fsdp2-holdnan"]:
        assert mine["commits"] == [step != NAN_STEP for step in range(1, STEPS + 1)]
        assert mine["grads_dropped"] and mine["halted_at"] is None
        assert all(math.isfinite(n) for step, n in enumerate(mine["norms"], 1) if step != NAN_STEP)
    # FSDP2's shards are snapshotted; FSDP1's flat shards are not (said once), its faulty steps still held
    assert f"snapshots every {SNAPSHOT_EVERY} steps (snapshot_every={SNAPSHOT_EVERY})" in log
    assert "snapshots off: the model's parameters are FSDP1 flat shards" in log
    for engine in ("fsdp2", "fsdp1"):
        for healthy, plain in zip(ranks[f"{engine}-recover"], ranks[f"{engine}-plain"], strict=True):
            assert all(healthy["commits"]) and healthy["losses"] == plain["losses"]


def test_a_healthy_fsdp2_run_with_snapshots_trains_bit_equal_to_one_without_lossguard(job):
    """Snapshots every SNAPSHOT_EVERY steps read each rank's shards and write nothing back: the same losses
    and, at the end, the same local shards of the weights and of Adam's state, bit for bit, on every rank."""
    out, ranks, _ = job
    for rank, (healthy, plain) in enumerate(zip(ranks["fsdp2-recover"], ranks["fsdp2-plain"], strict=True)):
        assert healthy["losses"] == plain["losses"] and healthy["final"] == plain["final"]
        snaps = [line for line in _lines(out, "fsdp2-recover", rank) if line["type"] == "snapshots"]
        assert [s["every"] for s in snaps] == [SNAPSHOT_EVERY]
        assert not [line for line in _lines(out, "fsdp2-recover", rank) if line.get("kind") == "rollback"]


def test_nan_weights_on_one_ranks_shard_roll_every_rank_back_to_the_same_snapshot_bit_equal(job):
    """NaN written into rank 1's local shard of one weight after step ROLL_STEP was applied: the next step's
    forward gathers it, the gate holds that step, and every rank restores the newest snapshot finite on
    every rank (taken as step ROLL_STEP - 1 was let through): each rank's local shards of the weights and of
    Adam's state after the rollback equal, bit for bit, those it held before that step was applied, and
    training goes on."""
    out, ranks, _ = job
    held, target = ROLL_STEP + 1, ROLL_STEP - 1
    for rank, mine in enumerate(ranks["fsdp2-rollnan"]):
        assert mine["commits"] == [step != held for step in range(1, STEPS + 1)]
        assert mine["halted_at"] is None and mine["grads_dropped"]
        assert all(math.isfinite(loss) for step, loss in enumerate(mine["losses"], 1) if step != held)
        rolls = [line for line in _lines(out, "fsdp2-rollnan", rank) if line.get("kind") == "rollback"]
        assert [(r["step"], r["ranks"], r["snapshot"]["step"]) for r in rolls] == [(held, [1], target)]
        assert "weights" in rolls[0]["restored"] and "optimizer state and its LRs" in rolls[0]["restored"]
        restored, snapshot = mine["after_hold"][str(held)], mine["before"][str(target)]
        assert sorted(restored) == sorted(snapshot) and any(k.endswith("exp_avg") for k in restored)
        assert restored == snapshot
    # each rank rolled back its own shards: they differ between the ranks
    assert ranks["fsdp2-rollnan"][0]["after_hold"][str(held)] != ranks["fsdp2-rollnan"][1]["after_hold"][str(held)]


def test_a_trainable_layer_no_rank_gets_a_gradient_for_is_named_at_the_first_step(job):
    """FSDP2 sets each shard's gradient after its reduce-scatter (no autograd hook sees it): at the first
    step every rank says which shards it holds a non-zero gradient of, in the first step's gather, and the
    shards none has are named once for the run (GRAD004, rank None); every rank halts there together."""
    out, ranks, _ = job
    summary = json.loads((out / "fsdp2-unused" / "summary.json").read_text())
    found = [f for f in summary["findings"] if f["code"] == "GRAD004"]
    assert len(found) == 1 and found[0]["step"] == 1 and found[0]["rank"] is None
    assert sorted(found[0]["data"]["params"]) == ["spare.bias", "spare.weight"]
    assert [r["halted_at"] for r in ranks["fsdp2-unused"]] == [1, 1]


@pytest.mark.parametrize("name", SCENARIOS)
def test_every_rank_made_the_same_collectives_and_the_guard_only_its_exchange(job, name):
    """The same collectives on both ranks (counted at torch.distributed: FSDP's and lossguard's alike); a
    guarded run makes those of the unguarded one plus one gather a step and the first step's object
    gather: the sharded norm travels inside the exchange, never in a collective of its own."""
    out, ranks, _ = job
    first, second = (r["collectives"] for r in ranks[name])
    assert first == second and sum(first.values()) > 0
    engine, arm = name.split("-")
    if arm == "guard":
        plain = ranks[f"{engine}-plain"][0]["collectives"]
        extra = {k: first.get(k, 0) - plain.get(k, 0) for k in set(first) | set(plain)}
        assert {k: v for k, v in extra.items() if v} == {"all_gather_single": STEPS, "all_gather_object": 1}
    for rank in (0, 1):
        if arm != "plain":
            assert not [line for line in _lines(out, name, rank) if line.get("event") == "internal-error"]


@pytest.mark.parametrize("name", ["fsdp2-guard", "fsdp1orig-guard", "fsdp2-nan"])
def test_analyze_reads_the_events_back_with_the_sharding_engine(job, name):
    out, _, _ = job
    report = analyze_json(out / name / "events")
    engine = name.split("-")[0]
    assert report["facts"]["sharding_engine"] == ("fsdp2" if engine == "fsdp2" else "fsdp1")
    assert report["stats"]["ranks"] == [0, 1]
    if name.endswith("nan"):
        assert report["verdict"] == "broken" and report["onset_step"] == NAN_STEP
        deepspeed = [c for c in report["causes"] if c["id"].startswith(("zero", "bf16-no-overflow"))]
        assert all(c["confidence"] == "unlikely" for c in deepspeed)
    else:
        assert report["verdict"] == "healthy"
        assert report["stats"]["train_logs"] == 2 * STEPS


LIGHTNING = ["lightning-plain", "lightning-guard", "lightning-nan"]


@pytest.fixture(scope="module")
def lightning_job(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp_lightning")
    run_job("fsdp_job.py", out, LIGHTNING, timeout_s=300)
    return out, rank_outputs(out, LIGHTNING)


def test_the_lightning_callback_on_fsdp2_trains_as_without_it_and_reports_fsdps_norm(lightning_job, job):
    """LossguardLightningCallback under ModelParallelStrategy (FSDP2): the same losses as without it, no
    finding, the same collectives on both ranks (its own: one gather a step and the first step's object
    gather), and the norm FSDP computes for the same model, data and seed in the plain loop."""
    out, ranks = lightning_job
    fsdp_norms = job[1]["fsdp2-plain"][0]["norms"]
    for rank, (mine, plain) in enumerate(zip(ranks["lightning-guard"], ranks["lightning-plain"], strict=True)):
        assert mine["losses"] == plain["losses"] and mine["halted_at"] is None
        records = _train(out, "lightning-guard", rank)
        assert [r["signals"]["grad_norm"] for r in records] == pytest.approx(fsdp_norms, rel=1e-6)
    assert json.loads((out / "lightning-guard" / "summary.json").read_text())["findings"] == []
    for name in LIGHTNING:
        first, second = (r["collectives"] for r in ranks[name])
        assert first == second
    guard, plain = (ranks[name][0]["collectives"] for name in ("lightning-guard", "lightning-plain"))
    assert {k: guard.get(k, 0) - plain.get(k, 0) for k in guard if guard.get(k, 0) != plain.get(k, 0)} == \
        {"all_gather_single": STEPS, "all_gather_object": 1}


def test_the_lightning_callback_on_fsdp2_halts_every_rank_at_a_nan(lightning_job):
    out, ranks = lightning_job
    assert [r["halted_at"] for r in ranks["lightning-nan"]] == [NAN_STEP, NAN_STEP]
    assert all(len(r["losses"]) == NAN_STEP for r in ranks["lightning-nan"])
    for rank in (0, 1):
        assert [h["step"] for h in _lines(out, "lightning-nan", rank) if h["type"] == "halt"] == [NAN_STEP]
