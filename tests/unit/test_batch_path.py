"""The engine's batch path (`feed_all`: detectors' `spared_when` tests route only the records that concern them)
must give exactly what feeding the records one by one to every detector gives: the same findings in the
same order, the same stats, series and onset window. Findings are compared, never a detector's private
state: sparing records is allowed to leave different bookkeeping as long as it reports the same.

Streams: every committed fixture, the speed bench's log, and random runs with faults injected at random
places (zeros, NaN/Inf, sentinels, LR 0, skipped steps, spikes, plateaus, decays, several ranks, evals,
events), so both the fast path and its fallback are exercised.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import random
import sys
from pathlib import Path

import pytest

from lossguard.core import engine as engine_module
from lossguard.core.engine import Engine
from lossguard.core.records import EVAL, EVENT, TRAIN, Record
from lossguard.detectors import make_detectors
from lossguard.detectors._base import PerRank
from lossguard.sources import discover, records
from tests.conftest import FIXTURES

ROOT = Path(__file__).resolve().parents[2]


def state_of(value):
    """A comparable picture of a detector's (or the engine's) state: NaN-safe, set-order-free."""
    if isinstance(value, float):
        return "nan" if math.isnan(value) else value
    if isinstance(value, PerRank):
        return {"per_rank": state_of(dict(value.items()))}
    if isinstance(value, dict):
        return {repr(k): state_of(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, collections.deque)):
        return [state_of(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted(repr(state_of(v)) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: state_of(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if hasattr(value, "__dict__") and not isinstance(value, type):
        return {k: state_of(v) for k, v in vars(value).items()}
    return value


def run_both(make_records) -> tuple[Engine, Engine]:
    one_by_one, batched = Engine(make_detectors()), Engine(make_detectors())
    returned, called = [], []
    for record in make_records():
        if new := one_by_one.feed(record):
            returned.append(((record.step, record.rank, record.line_no), [f.to_dict() for f in new]))
    batched.feed_all(make_records(), lambda record, new: called.append(
        ((record.step, record.rank, record.line_no), [f.to_dict() for f in new])))
    assert returned == called  # watch places its alerts with on_findings
    return one_by_one, batched


def assert_same(make_records) -> Engine:
    one_by_one, batched = run_both(make_records)
    ra, rb = one_by_one.finish(), batched.finish()
    assert [f.to_dict() for f in ra.findings] == [f.to_dict() for f in rb.findings]
    assert state_of(ra.stats) == state_of(rb.stats)
    assert state_of(ra.series.to_dict()) == state_of(rb.series.to_dict())
    assert [(r.step, r.rank, r.line_no) for r in ra.onset_window] == \
        [(r.step, r.rank, r.line_no) for r in rb.onset_window]
    assert ra.num_suppressed == rb.num_suppressed
    return batched


def _fixture_inputs():
    for run in sorted((FIXTURES / "real").iterdir()):
        for path in sorted(run.iterdir()):
            if path.name != "meta.json":
                yield pytest.param(path, id=f"{run.name}/{path.name}")
    excerpts = FIXTURES / "excerpts"
    for path in sorted(p for p in excerpts.rglob("*") if p.is_file()):  # the format zoo's files one by one
        if path.suffix != ".md":
            yield pytest.param(path, id=f"{path.relative_to(excerpts.parent)}")


@pytest.mark.parametrize("path", list(_fixture_inputs()))
def test_fixture_streams_match(path):
    assert_same(lambda: records(discover([str(path)])))


def test_many_tools_read_as_one_run_match():
    """Every hand-written excerpt read as one run: many sources, steps that go back, RL and plain records
    side by side, events between. A harder stream than any one log (it found an RL record that a detector
    skipped on one path and counted on the other)."""
    assert_same(lambda: records(discover([str(FIXTURES / "excerpts")])))


def test_speed_bench_log_matches(tmp_path):
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from analyze_speed import build_log
    finally:
        sys.path.remove(str(ROOT / "bench"))
    log = tmp_path / "train.log"
    build_log(log, 60_000)
    batched = assert_same(lambda: records(discover([str(log)])))
    # One record per logged step: the parser merges a step's `step=` line and its log dict.
    assert batched.stats.num_train > 1800


# -- random runs with faults ---------------------------------------------------------------------------
FAULTS = ("zero-loss", "nan-loss", "inf-grad", "sentinel", "sentinel-printed", "lr-zero", "skip", "skip-storm",
          "spike", "plateau", "diverge", "decay", "grad-zero", "masked", "eval", "overflow-event", "rank",
          "raw-loss", "tokens-zero", "huge")


def random_run(seed: int, with_faults: bool = True) -> list[Record]:
    rng = random.Random(seed)
    out: list[Record] = []
    loss, lr, skipped = 2.0 + rng.random() * 4, 1e-4, 0.0
    faults = {rng.randrange(30, 1500): rng.choice(FAULTS) for _ in range(rng.randrange(0, 4) * with_faults)}
    active: dict[str, int] = {}
    with_ds_lines = rng.random() < 0.5
    rank = None
    for step in range(1, 1500):
        if step in faults:
            active[faults[step]] = rng.randrange(1, 40)
        loss = max(0.05, loss * (0.999 + rng.uniform(-0.003, 0.002)))
        grad = rng.uniform(0.2, 3.0)
        lr = lr if rng.random() < 0.3 else lr * 0.999
        value, step_lr, grad_value = loss, lr, grad
        signals: dict[str, float] = {}
        for fault in list(active):
            active[fault] -= 1
            if active[fault] <= 0:
                del active[fault]
            if fault == "zero-loss":
                value = 0.0
            elif fault == "nan-loss":
                value = math.nan
            elif fault == "inf-grad":
                grad_value = math.inf
            elif fault == "sentinel":
                grad_value = math.sqrt(rng.choice((1, 2, 3)))
            elif fault == "sentinel-printed":
                grad_value = 1.414
            elif fault == "lr-zero":
                step_lr = 0.0
            elif fault == "skip":
                skipped += 1
            elif fault == "skip-storm":
                skipped += 1
                grad_value = math.inf
            elif fault == "spike":
                value = loss * 5 + 1
            elif fault == "plateau":
                value = 3.25
            elif fault == "diverge":
                value = loss * 4 + 3
            elif fault == "decay":
                loss = value = loss * 0.5
            elif fault == "grad-zero":
                grad_value = 0.0
            elif fault == "masked":
                value, grad_value = 0.0, 0.0
            elif fault == "raw-loss":
                signals["raw_loss"] = value
            elif fault == "tokens-zero":
                signals["num_label_tokens"] = 0.0
            elif fault == "huge":
                value = 1e308
            elif fault == "rank":
                rank = rng.choice((None, 0, 1))
        signals.update({"loss": value, "grad_norm": grad_value, "lr": step_lr, "epoch": step / 1500})
        if rng.random() < 0.05:
            del signals["grad_norm"]
        out.append(Record(step=step, rank=rank, signals=signals, source="run.log", line_no=2 * step))
        if with_ds_lines:
            out.append(Record(step=step, signals={"skipped_steps": skipped, "lr": step_lr}, source="run.log",
                              line_no=2 * step + 1))
        if "eval" in active or rng.random() < 0.004:
            out.append(Record(step=step, kind=EVAL, signals={"eval_loss": loss * 1.1}, source="run.log"))
        if "overflow-event" in active:
            out.append(Record(step=step + 1, kind=EVENT, event="overflow", data={"new_scale": 2.0 ** 10}))
        if rng.random() < 0.002:
            out.append(Record(step=step + 1, kind=EVENT, event="tokenization-mismatch", data={"got": 5}))
    return out


@pytest.mark.parametrize("seed", range(120))
def test_random_runs_with_faults_match(seed):
    run = random_run(seed)
    assert_same(lambda: [dataclasses.replace(r, signals=dict(r.signals), data=dict(r.data)) for r in run])


def test_small_batches_cross_every_boundary(monkeypatch):
    """Batches of 3 put fault onsets at every position of a batch."""
    monkeypatch.setattr(engine_module, "_BATCH", 3)
    for seed in range(20):
        run = random_run(seed)
        assert_same(lambda run=run: [dataclasses.replace(r, signals=dict(r.signals)) for r in run])


def test_every_builtin_detector_takes_the_fast_path_on_a_healthy_run():
    """Not only equal, but fast: on a healthy stream no detector may decline (else the batch path is
    the slow path in disguise)."""
    declined = collections.Counter()
    engine = Engine(make_detectors())
    for detector in engine.detectors:
        if detector.spared_when is not None:  # routed nothing: its observe must not run

            def refuse(record, code=detector.code):
                if record.kind == TRAIN:  # evals and events are fed one by one, not batched
                    declined[code] += 1
                return []

            detector.observe = refuse

    run = [r for r in random_run(7, with_faults=False) if r.kind != EVENT]
    engine.feed_all(run)
    assert not declined, declined
    from lossguard.core.signals import SIGNALS  # event-only detectors never see a batch

    # After a healthy run: a detector's spared_when may depend on its state (SCALE001 reads every record
    # until training has started, and while a run of skips is open).
    missing = [d.code for d in engine.detectors if d.spared_when is None
               and d.code != "RANK001"
               and not d.wants.isdisjoint(SIGNALS)]
    assert not missing, f"detectors without a fast path: {missing}"
