"""The FSDP pieces of the live guard that run without a process group: the run's gradient norm folded from
each rank's shard (gathered rows and the reduced summary alike), a parameter the guard cannot read skipped
and said once, and the diagnosis on a run whose facts show FSDP. The two-rank FSDP runs themselves are in
tests/integration/test_live_fsdp.py."""

from __future__ import annotations

import json
import math

import pytest
import torch

import lossguard
from lossguard.diagnose.ranking import rank_causes
from lossguard.knowledge.conditions import RunEvidence
from lossguard.monitor import summary, wire

LAYOUT = wire.Layout(num_lr=1, groups=("head",))


def _row(grad_sq=None, replicated=None, loss=2.0) -> list[float]:
    values = wire.StepValues(raw_loss=loss, grad_norm=replicated, grad_sq_shard=grad_sq, lrs=[1e-3])
    return LAYOUT.encode(values, torch.device("cpu")).tolist()


def test_the_gathered_rows_carry_the_norm_of_every_ranks_shard():
    rows = wire.fold_shard_norms([_row(grad_sq=9.0), _row(grad_sq=16.0)])
    assert [LAYOUT.decode(row)[0]["grad_norm"] for row in rows] == [5.0, 5.0]
    with_replicated = wire.fold_shard_norms([_row(grad_sq=9.0, replicated=0.0), _row(grad_sq=7.0, replicated=3.0)])
    assert [LAYOUT.decode(row)[0]["grad_norm"] for row in with_replicated] == [4.0, 5.0]


def test_a_non_finite_shard_makes_every_ranks_norm_non_finite_and_plain_rows_are_untouched():
    rows = wire.fold_shard_norms([_row(grad_sq=1.0), _row(grad_sq=math.nan)])
    assert all(math.isnan(LAYOUT.decode(row)[0]["grad_norm"]) for row in rows)
    plain = [_row(replicated=2.0), _row(replicated=2.0)]
    assert wire.fold_shard_norms([list(r) for r in plain]) == plain


def test_the_reduced_summary_folds_the_same_norm_and_looks_closer_at_a_nan():
    rows = [_row(grad_sq=9.0), _row(grad_sq=16.0)]
    seen = summary.fold_shard_norm(summary.of_rows(LAYOUT, [list(r) for r in rows]))
    assert summary.run_record(seen, 1).signals["grad_norm"] == 5.0
    assert summary.reasons(seen, None) == []
    bad = summary.fold_shard_norm(summary.of_rows(LAYOUT, [_row(grad_sq=9.0), _row(grad_sq=math.inf)]))
    assert "non-finite grad norm" in summary.reasons(bad, None)


def test_a_parameter_the_guard_cannot_read_is_skipped_and_said_once(tmp_path, capsys):
    """A parameter left on the meta device (never materialised, unused by the forward): the guard starts,
    leaves it out of the update ratios, says so once on the console and once in the events file, and the
    loop never sees an exception."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    model.register_parameter("ghost", torch.nn.Parameter(torch.empty(3, device="meta")))
    optimizer = torch.optim.SGD([p for p in model.parameters() if not p.is_meta], lr=0.1)
    guard = lossguard.Guard(model, optimizer, events_dir=str(tmp_path), fingerprint_every=1)
    for step in range(3):
        loss = model(torch.randn(2, 4, generator=torch.Generator().manual_seed(step))).pow(2).mean()
        loss.backward()
        optimizer.step()
        guard.step(loss=loss)
        optimizer.zero_grad()
    guard.close()
    said = [line for line in capsys.readouterr().err.splitlines() if "cannot read" in line]
    assert len(said) == 1 and "ghost" in said[0] and "meta device" in said[0]
    lines = [json.loads(line) for line in (tmp_path / "events-rank0.jsonl").read_text().splitlines()]
    events = [line for line in lines if line.get("event") == "unreadable-tensors"]
    assert len(events) == 1 and events[0]["data"]["params"] == ["ghost"]
    steps = [line for line in lines if line.get("kind") == "train"]
    assert len(steps) == 3 and all("update_ratio" in s["signals"] for s in steps)
    assert not any(line.get("event") == "internal-error" for line in lines)


DEEPSPEED_ONLY = ("zero12-overlap-race", "zero12-multi-rank-bucket", "zero12-pingpong-index-reset",
                  "zero12-buffer-lifetime", "bf16-no-overflow-check")


@pytest.mark.parametrize("engine", ["fsdp1", "fsdp2"])
def test_causes_that_need_deepspeed_are_unlikely_on_an_fsdp_run(engine):
    facts = {"sharding_engine": engine, "torch_version": "2.13.0", "world_size": 8, "bf16": True}
    ranked = {c.id: c for c in rank_causes("nonfinite-hidden", RunEvidence(facts=facts))}
    assert all(cause not in ranked or ranked[cause].likelihood == "unlikely" for cause in DEEPSPEED_ONLY), ranked
    # Even beside facts that would point at the ZeRO-1/2 race, FSDP rules it out, and says why.
    race_facts = {**facts, "zero_stage": 2, "overlap_comm": True, "deepspeed_version": "0.12.0"}
    race = next(c for c in rank_causes("nonfinite-hidden", RunEvidence(facts=race_facts))
                if c.id == "zero12-overlap-race")
    assert race.likelihood == "unlikely" and any(f"FSDP shard the model ({engine})" in line for line in race.against)
    without = next(c for c in rank_causes("nonfinite-hidden", RunEvidence(facts={
        k: v for k, v in race_facts.items() if k != "sharding_engine"})) if c.id == "zero12-overlap-race")
    assert without.likelihood != "unlikely" and not without.against


@pytest.mark.parametrize("topic", ["fsdp", "fsdp2", "fsdp-shown", "unreadable-tensors", "sharding_engine"])
def test_explain_says_what_the_fsdp_ids_mean(topic):
    from lossguard.explain import explain, topics

    text = explain(topic)
    assert text is not None and "fsdp-shown" in text and "unreadable-tensors" in text
    assert "fsdp" in dict(topics())


def test_a_summary_only_step_writes_the_runs_norm_into_each_sharded_ranks_own_record(tmp_path):
    """Above the detail threshold (a simulated world of four ranks), a step read from the summary alone still
    leaves each rank's file the run's gradient norm, as a gathered step does."""
    from lossguard.monitor.core import Monitor
    from lossguard.monitor.options import GuardOptions

    monitor = Monitor(GuardOptions(events_dir=str(tmp_path), detail_every_step_up_to=1), torch.nn.Linear(2, 2))
    rows = [_row(grad_sq=v) for v in (1.0, 2.0, 3.0, 10.0)]
    seen = summary.fold_shard_norm(summary.of_rows(LAYOUT, [list(r) for r in rows]))
    monitor.layout = LAYOUT
    monitor.analyse_summary(5, seen, rows[0])
    monitor.close()
    lines = [json.loads(line) for line in (tmp_path / "events-rank0.jsonl").read_text().splitlines()]
    own = [line for line in lines if line.get("kind") == "train" and line["rank"] == 0]
    assert own[0]["signals"]["grad_norm"] == 4.0


def test_under_hsdp_each_shard_counts_once_in_the_summed_norm():
    """A DTensor's share of the summed squared norm: 1 when sharded over the whole mesh (FSDP2), 1/R when R
    replica groups hold the same shard (HSDP's (Replicate, Shard) placements), none when fully replicated.
    Real placement classes; the mesh, which needs a process group, stands in by its sizes."""
    from torch.distributed.tensor import Replicate, Shard

    from lossguard.monitor import sharding

    class Mesh:
        def __init__(self, *sizes):
            self.sizes = sizes

        def size(self, dim):
            return self.sizes[dim]

    class Param:
        def __init__(self, placements, mesh):
            self.placements, self.device_mesh = placements, mesh

    assert sharding._dtensor_share(Param((Shard(0),), Mesh(8))) == 1.0
    assert sharding._dtensor_share(Param((Replicate(), Shard(0)), Mesh(2, 4))) == 0.5
    assert sharding._dtensor_share(Param((Replicate(),), Mesh(8))) is None
