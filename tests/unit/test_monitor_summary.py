"""The step summary above the world-size threshold: what the all_reduce of every rank's row gives (over a
real four-process gloo group), when it says to look at each rank, the run-level record, and the engine
fed a mix of run-level and per-rank records over a long simulated run of many ranks."""

from __future__ import annotations

import json
import math
import random

import pytest

torch = pytest.importorskip("torch")

from lossguard.monitor import summary, wire  # noqa: E402
from lossguard.monitor.core import Monitor  # noqa: E402
from lossguard.monitor.options import GuardOptions  # noqa: E402
from lossguard.monitor.wire import GRAD_NORM, LABELS, MIN_LABELS, NUM_BASE, RAW_LOSS  # noqa: E402

CPU = torch.device("cpu")
LAYOUT = wire.Layout(num_lr=2, groups=("attn", "mlp"))


def row(**kw) -> list[float]:
    base = {"raw_loss": 2.0, "num_label_tokens": 100.0, "min_label_tokens": 40.0, "grad_norm": 1.25,
            "skipped_steps": 0.0, "lrs": [1e-4, 2e-5]}
    return LAYOUT.encode(wire.StepValues(**{**base, **kw}), CPU).tolist()


ROWS = [row(), row(raw_loss=3.0, num_label_tokens=0.0, min_label_tokens=0.0), row(raw_loss=math.nan, grad_norm=math.inf),
        LAYOUT.error_vector(CPU).tolist(), row(num_label_tokens=None, raw_loss=torch.tensor(2.5))]


def _rank_reduces(rank: int, world: int, store: str, out: str) -> None:
    import torch.distributed as torch_dist

    from lossguard.monitor import dist

    torch_dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    vector = torch.tensor(ROWS[rank], dtype=torch.float64)
    reduced, own = dist.reduce_summary(*summary.contributions(LAYOUT, vector), vector)
    with open(f"{out}.{rank}", "w") as fh:
        json.dump({"reduced": [repr(v) for v in reduced], "own": [repr(v) for v in own]}, fh)
    torch_dist.barrier()
    torch_dist.destroy_process_group()


def test_the_all_reduce_of_every_rank_row_is_the_summary_of_the_rows(tmp_path):
    """Five real processes over gloo, one row each (healthy, zero labels, NaN loss and inf norm, a failed
    rank, no labels measured): every rank gets the same numbers, the ones the host reduction gives."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    world = len(ROWS)
    procs = [context.Process(target=_rank_reduces, args=(r, world, tmp_path / "store", tmp_path / "out"))
             for r in range(world)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
    assert [p.exitcode for p in procs] == [0] * world
    results = [json.loads((tmp_path / f"out.{r}").read_text()) for r in range(world)]
    reduced = [[float(v) for v in r["reduced"]] for r in results]
    assert all(r == reduced[0] for r in reduced)
    assert [float(v) for v in results[2]["own"]][RAW_LOSS] != [float(v) for v in results[2]["own"]][RAW_LOSS]  # NaN
    assert reduced[0] == summary.reduce_on_host(LAYOUT, ROWS)
    seen = summary.Summary.read(LAYOUT, reduced[0])
    assert seen.errors == 1
    assert (seen.present[RAW_LOSS], seen.nonfinite[RAW_LOSS], seen.total[RAW_LOSS]) == (4, 1, 7.5)
    assert (seen.high[RAW_LOSS], seen.low[RAW_LOSS]) == (3.0, 2.0)
    assert (seen.present[LABELS], seen.zeros[LABELS], seen.total[LABELS], seen.low[MIN_LABELS]) == (3, 1, 200.0, 0.0)
    assert seen.nonfinite[GRAD_NORM] == 1 and seen.value(GRAD_NORM) == 1.25  # the finite ones agree exactly
    assert seen.present[NUM_BASE + 1] == 4 and seen.value(NUM_BASE + 1) == 2e-5


def _reasons(rows, last_skips=None):
    return summary.reasons(summary.of_rows(LAYOUT, rows), last_skips)


def test_a_healthy_step_needs_no_detail_even_with_noisy_losses():
    rng = random.Random(0)
    rows = [row(raw_loss=1.0 + rng.uniform(-0.4, 0.4), num_label_tokens=float(rng.randint(1, 500))) for _ in range(64)]
    assert _reasons(rows, (0.0, 0.0)) == []


@pytest.mark.parametrize(("odd", "why"), [
    ({"raw_loss": math.nan}, "non-finite loss"),
    ({"grad_norm": math.inf}, "non-finite grad norm"),
    ({"lrs": [math.nan, 1e-5]}, "non-finite lr"),
    ({"num_label_tokens": 0.0, "min_label_tokens": 0.0}, "zero label tokens"),
    ({"min_label_tokens": 0.0}, "zero fewest label tokens"),
    ({"raw_loss": 0.0}, "zero loss"),
    ({"grad_norm": 0.0}, "zero grad norm"),
    ({"raw_loss": 6.5}, "a rank's loss far from the mean"),
    ({"raw_loss": -1.0}, "a rank's loss far from the mean"),
    ({"skipped_steps": 1.0}, "skipped steps moved"),
    ({"param_fingerprint": 2.0}, "fingerprints differ"),
])
def test_one_odd_rank_of_many_makes_every_rank_look_closer(odd, why):
    rows = [row(param_fingerprint=1.0) for _ in range(63)]
    rows.insert(17, row(**{"param_fingerprint": 1.0, **odd}))
    assert why in _reasons(rows, (0.0, 0.0))


def test_a_skip_on_every_rank_is_seen_once_then_the_count_is_the_new_normal():
    rows = [row(skipped_steps=1.0) for _ in range(8)]
    assert _reasons(rows, (0.0, 0.0)) == ["skipped steps moved"]
    assert _reasons(rows, (1.0, 1.0)) == []
    assert _reasons([row(), LAYOUT.error_vector(CPU).tolist()], (0.0, 0.0)) == ["1 rank(s) failed"]


def test_the_run_level_record_speaks_for_the_run():
    rows = [row(raw_loss=2.0, num_label_tokens=100.0, min_label_tokens=40.0),
            row(raw_loss=3.0, num_label_tokens=50.0, min_label_tokens=20.0, update_ratios=[1e-3, math.nan])]
    record = summary.run_record(summary.of_rows(LAYOUT, rows), 7)
    assert (record.step, record.rank) == (7, None)
    assert record.signals == {"raw_loss": 2.5, "loss": 2.5, "num_label_tokens": 150.0, "min_label_tokens": 20.0,
                              "grad_norm": 1.25, "skipped_steps": 0.0, "lr": 1e-4, "update_ratio": 1e-3}
    assert record.data["lr_groups"] == [1e-4, 2e-5] and math.isnan(record.data["update_ratio_groups"]["mlp"])


class World:
    """A world of `size` ranks at each step: the rows the gather would return (made up by `make_row`),
    and what the all_reduce of them would return (the summary's own reduction, on the host)."""

    def __init__(self, layout: wire.Layout, size: int, make_row) -> None:
        self.layout, self.size, self.make_row = layout, size, make_row
        self.step = 0
        self.gathers = 0

    def rows(self) -> list[list[float]]:
        return [self.make_row(self.step, rank) for rank in range(self.size)]

    def gather_rows(self, vector):
        self.gathers += 1
        return self.rows()

    def reduce_summary(self, sums, maxes, own):
        rows = self.rows()
        return summary.reduce_on_host(self.layout, rows), rows[0]


def _simulated_run(size: int, steps: int, fault=None, **options):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(32, 8), torch.nn.Linear(8, 32))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    monitor = Monitor(GuardOptions(console=False, detail_every_step_up_to=0, fingerprint_every=50, **options),
                      model, optimizer)
    rng = random.Random(size)

    def make_row(step: int, rank: int) -> list[float]:
        values = wire.StepValues(raw_loss=2.5 * 0.997 ** step + rng.uniform(-0.3, 0.3),
                                 num_label_tokens=float(rng.randint(300, 512)), min_label_tokens=float(rng.randint(100, 150)),
                                 grad_norm=1.0 + 0.5 * math.sin(step / 7), skipped_steps=0.0, lrs=[1e-4])
        if monitor._scheduled(step):
            values.param_fingerprint, values.update_ratios = 1000.0 + step, [1e-3] * len(monitor.layout.groups)
        if fault is not None:
            fault(step, rank, values)
        return monitor.layout.encode(values, CPU).tolist()

    world = monitor.exchange.collectives = World(monitor.layout, size, make_row)
    model(torch.arange(8)).sum().backward()  # the first step's check for parameters without a gradient
    halted = None
    for step in range(1, steps + 1):
        world.step = step
        if monitor.end_step(step) and halted is None:
            halted = step
    findings = [*monitor._emitted, *monitor.close()]
    return monitor, halted, findings


def test_a_long_healthy_run_of_many_ranks_raises_nothing_and_mostly_reduces():
    monitor, halted, findings = _simulated_run(64, 400, halt_on="info")
    assert halted is None and findings == []
    # the first step gathers; every other one, the fingerprint steps (every 50th) included, is read from the
    # summary (the fingerprints agree)
    assert monitor.steps_by_path == {"detail": 1, "summary": 399}


def test_labels_masked_on_one_rank_of_many_are_named_once_by_rank():
    def mask(step, rank, values):
        if rank == 37 and step >= 120:
            values.num_label_tokens = values.min_label_tokens = 0.0
            values.raw_loss = 0.0

    monitor, halted, findings = _simulated_run(64, 200, fault=mask, halt_on="critical")
    assert halted == 120
    labels = [f for f in findings if f.code == "LABEL001"]
    assert len(labels) == 1 and (labels[0].rank, labels[0].step) == (37, 120)
    assert monitor.steps_by_path["summary"] > 100


def test_a_nan_on_one_rank_of_many_is_named_by_rank_and_the_run_goes_back_to_summaries():
    def poison(step, rank, values):
        if rank == 5 and step == 80:
            values.raw_loss = math.nan

    monitor, halted, findings = _simulated_run(64, 200, fault=poison)
    nonfinite = [f for f in findings if f.code == "LOSS001"]
    assert len(nonfinite) == 1 and (nonfinite[0].rank, nonfinite[0].step) == (5, 80)
    # step 80 and the DETAIL_AFTER steps after it gather; later healthy steps reduce again
    assert monitor.steps_by_path == {"detail": 1 + 1 + summary.DETAIL_AFTER, "summary": 200 - 7}
