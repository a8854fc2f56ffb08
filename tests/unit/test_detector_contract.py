"""The detector contract (core/detector.py): what a detector declares, and what the engine does with it."""

from __future__ import annotations

import math

import pytest

from lossguard.core.detector import Detector
from lossguard.core.engine import Engine
from lossguard.core.findings import Finding, Severity
from lossguard.core.profile import LossProfile
from lossguard.core.records import TRAIN, Record
from lossguard.detectors import make_detectors, registered


@pytest.mark.parametrize("factory", registered(), ids=lambda f: f().code)
def test_every_builtin_derives_from_the_contract_and_declares_a_changing_spared_when(factory):
    detector = factory()
    assert isinstance(detector, Detector)
    # The engine re-reads `spared_when` only where `spared_when_changes` says so: a property undeclared
    # would be read once per batch and go stale.
    is_property = isinstance(getattr(type(detector), "spared_when", None), property)
    assert is_property == detector.spared_when_changes, detector.code


class Plugin:
    """A detector as a plugin writes it: no base class, only the five names."""

    code, name, signature = "TEST997", "test.plugin", None

    def __init__(self) -> None:
        self.steps: list[int | None] = []

    def observe(self, record: Record) -> list[Finding]:
        self.steps.append(record.step)
        if record.signals.get("loss") == 0.5:
            return [Finding(self.code, self.name, Severity.WARNING, "half", step=record.step)]
        return []

    def finish(self) -> list[Finding]:
        return []


def test_a_plugin_without_the_base_class_sees_every_record_on_the_batch_path():
    plugin = Plugin()
    engine = Engine([plugin, *make_detectors()])
    stream = [Record(step=s, signals={"loss": 2.0 - s / 1000, "grad_norm": 1.0, "lr": 1e-4}) for s in range(1, 1200)]
    stream[700] = Record(step=701, signals={"loss": 0.5, "grad_norm": 1.0, "lr": 1e-4})
    engine.feed_all(stream)
    result = engine.finish()
    assert plugin.steps == list(range(1, 1200))
    assert [(f.code, f.step) for f in result.findings if f.code == "TEST997"] == [("TEST997", 701)]


def _train(step: int, loss: float = 2.0, grad: float = 0.8, lr: float = 1e-4) -> Record:
    return Record(step=step, signals={"loss": loss, "grad_norm": grad, "lr": lr}, source="t.log", line_no=step)


def _healthy(first: int, last: int) -> list[Record]:
    return [_train(s, loss=2.0 - s / 1000) for s in range(first, last)]


# code -> (the record that opens a run or a wait, the record that ends it): the engine must hand the
# detector the second, instead of the detector inferring from counts that something came between.
OPEN_AND_END = {
    "GRAD001": (_train(20, grad=math.sqrt(2)), _train(21, grad=0.7)),
    "GRAD002": (_train(20, grad=0.0), _train(21, grad=0.7)),
    "LOSS003": (_train(20, loss=0.0), _train(21, loss=1.5)),
    "LR001": (_train(20, lr=0.0), _train(21, lr=1e-4)),
    "LOSS002": (_train(20, loss=0.0, grad=0.5), _train(21, loss=1.5)),
    "LOSS001": (_train(20, grad=math.inf), _train(21, grad=0.7)),
    "LABEL001": (_train(20, loss=0.0, grad=0.0), _train(21, loss=1.5)),
}


@pytest.mark.parametrize("code", list(OPEN_AND_END))
def test_a_run_open_is_never_ended_by_a_record_the_detector_was_spared(code):
    opening, ending = OPEN_AND_END[code]
    engine = Engine(make_detectors())
    detector = next(d for d in engine.detectors if d.code == code)
    seen: list[int | None] = []
    observe = detector.observe

    def watched(record: Record) -> list[Finding]:
        if record.kind == TRAIN:
            seen.append(record.step)
        return observe(record)

    detector.observe = watched
    engine.feed_all([*_healthy(1, 20), opening, ending, *_healthy(22, 40)])
    assert 20 in seen and 21 in seen, seen
    assert 5 not in seen  # healthy records before are spared: the fast path holds


def test_the_profile_counts_runs_of_high_and_far_losses():
    profile = LossProfile()
    losses = [1.0, 1.0, 1.0, 5.0, 5.0, 1.0, 5.0, 10.0, 10.0]
    marks = profile.advance(None, {"loss": losses}, list(range(1, 10)), 0, len(losses))
    # High: over twice the start and 2 above it; far: three times and 3 above. A loss under breaks both.
    assert marks[4].high_run == (2, 4) and marks[4].far_run == (2, 4)
    assert marks[5].high_run[0] == 0 and marks[5].far_run[0] == 0  # marked as a recovered spike
    assert marks[8].high_run == (3, 7) and marks[8].far_run == (3, 7)
    # One log at a time gives the same runs.
    one = LossProfile()
    last = {}
    for i, loss in enumerate(losses):
        last = one.advance(None, {"loss": [loss]}, [i + 1], 0, 1) or last
    assert last[0].high_run == (3, 7)
