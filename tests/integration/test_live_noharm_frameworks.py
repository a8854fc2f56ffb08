"""Recovery that does no harm under the frameworks (issue 32, the do-no-harm suite), in real two-rank runs
over gloo: healthy but unusual runs under `transformers.Trainer` with `LossguardCallback(recover=True)`
(without DeepSpeed, and under DeepSpeed ZeRO-2), under a raw ZeRO-2 engine with `attach(engine,
recover=True)`, and under Lightning with `LossguardLightningCallback(recover=True)` train exactly as their
unguarded twins: the same losses, bit-equal final weights on CPU, no recovery event. Each run switches to
harder data mid-run (a loss leap far above the gate's loss limit, with an ordinary gradient norm), with
gradient accumulation 4, micro-batch 1 or a `BatchEncoding` collator (live_jobs/noharm_hf_job.py,
live_jobs/noharm_lightning_job.py). Before the fix, every DeepSpeed run here held the switch (the gate had
no gradient norm before `engine.step()` and judged the jump by the loss alone), replayed it and rolled back
until the budget ran out."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from lossguard.monitor.jump import LossHistory  # noqa: E402
from tests.integration.live_helpers import rank_outputs, run_job  # noqa: E402

pytestmark = pytest.mark.integration

STEPS, SHIFT_AT = 28, 22  # noharm_hf_job.py
CASES = ["shift", "ga4", "mb1", "enc"]
ACCUMULATE = {"ga4": 4}


def _launch(tmp_path_factory, script: str, names: list[str]):
    out = tmp_path_factory.mktemp(script.removesuffix(".py"))
    scenarios = [f"{name}-{arm}" for name in names for arm in ("plain", "recover")]
    run_job(script, out, scenarios, timeout_s=300)  # a hang fails here
    return out, rank_outputs(out, scenarios)


@pytest.fixture(scope="module")
def trainer_ddp(tmp_path_factory):
    return _launch(tmp_path_factory, "noharm_hf_job.py", [f"ddp-{case}" for case in CASES])


@pytest.fixture(scope="module")
def deepspeed_runs(tmp_path_factory):
    pytest.importorskip("deepspeed")
    return _launch(tmp_path_factory, "noharm_hf_job.py",
                   [f"z2-{case}" for case in CASES] + ["attach-shift", "attach-ga4"])


@pytest.fixture(scope="module")
def lightning_runs(tmp_path_factory):
    pytest.importorskip("lightning")
    return _launch(tmp_path_factory, "noharm_lightning_job.py", ["shift", "ga4"])


def _no_harm(out, ranks, name: str) -> float:
    """The guarded run against its unguarded twin; the largest weight difference (0.0: bit-equal)."""
    guarded, plain = f"{name}-recover", f"{name}-plain"
    for r in (0, 1):
        lines = [json.loads(x) for x in (out / guarded / "events" / f"events-rank{r}.jsonl").read_text().splitlines()]
        assert [x for x in lines if x["type"] in ("recovery", "halt", "skip")] == [], name
        mine, twin = ranks[guarded][r], ranks[plain][r]
        assert mine["halted_at"] is None and mine["global_step"] == twin["global_step"] == STEPS, name
        assert mine["losses"] == twin["losses"], name
    return max(float((a.float() - b.float()).abs().max()) for r in (0, 1)
               for a, b in _weights(out, guarded, plain, r))


def _weights(out, guarded: str, plain: str, rank: int):
    mine = torch.load(out / guarded / f"final-rank{rank}.pt")
    theirs = torch.load(out / plain / f"final-rank{rank}.pt")
    assert mine.keys() == theirs.keys() and mine
    return [(mine[key], theirs[key]) for key in theirs]


def _the_switch_is_a_jump_by_its_loss(ranks, name: str, accumulate: int = 1) -> None:
    """What the gate's loss test sees (each step's highest loss over the ranks, against the history of the
    steps before it, monitor/jump.py): the switch is far above its limit, so only the gradient norm kept
    the step from being held. At micro-batch 1 the loss is still falling steeply when the data switches
    (one sequence a step learns slower), its spread is wide: there the leap alone is asserted."""
    steps = [[sum(rank["losses"][i * accumulate:(i + 1) * accumulate]) / accumulate for rank in ranks[f"{name}-plain"]]
             for i in range(STEPS)]
    history = LossHistory()
    for peak in (max(step) for step in steps[:SHIFT_AT - 1]):
        history.commit(peak)
    assert history.warm
    if not name.endswith("mb1"):
        assert max(steps[SHIFT_AT - 1]) > history.bound()[2]
    assert min(steps[SHIFT_AT - 1]) > 10 * max(steps[SHIFT_AT - 2])


@pytest.mark.parametrize("case", CASES)
def test_the_trainer_without_deepspeed_trains_exactly_as_without_lossguard(trainer_ddp, case):
    out, ranks = trainer_ddp
    assert _no_harm(out, ranks, f"ddp-{case}") == 0.0
    _the_switch_is_a_jump_by_its_loss(ranks, f"ddp-{case}", ACCUMULATE.get(case, 1))


@pytest.mark.parametrize("case", CASES)
def test_the_trainer_under_deepspeed_trains_exactly_as_without_lossguard(deepspeed_runs, case):
    out, ranks = deepspeed_runs
    assert _no_harm(out, ranks, f"z2-{case}") == 0.0
    _the_switch_is_a_jump_by_its_loss(ranks, f"z2-{case}", ACCUMULATE.get(case, 1))


@pytest.mark.parametrize("case", ["shift", "ga4"])
def test_attach_does_not_hold_a_loss_only_jump(deepspeed_runs, case):
    """`attach(engine, recover=True)` on ZeRO-2: the harder batches' loss leaps far above the run's spread
    while the gradient norm each rank measures before `engine.step()` stays ordinary: committed, every
    step, bit-equal to the unguarded engine."""
    out, ranks = deepspeed_runs
    assert _no_harm(out, ranks, f"attach-{case}") == 0.0
    _the_switch_is_a_jump_by_its_loss(ranks, f"attach-{case}", ACCUMULATE.get(case, 1))


@pytest.mark.parametrize("case", ["shift", "ga4"])
def test_lightning_trains_exactly_as_without_lossguard(lightning_runs, case):
    out, ranks = lightning_runs
    assert _no_harm(out, ranks, case) == 0.0
    _the_switch_is_a_jump_by_its_loss(ranks, case, ACCUMULATE.get(case, 1))
