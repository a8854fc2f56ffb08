"""SignalCounts (core/counts.py): what detectors read about the records the engine spared them, and two
streams whose onset depends on it, fed one by one and through `feed_all`."""

from __future__ import annotations

import math

from lossguard.core.counts import SignalCounts
from lossguard.core.engine import Engine
from lossguard.core.records import Record
from lossguard.detectors import make_detectors


def test_counts_and_last_two_values_from_runs_and_single_records():
    counts = SignalCounts()
    counts.advance(0, {"loss": [1.0, None, 2.0, 3.0], "lr": [None] * 4}, 0, 3)
    assert (counts.seq(0, "loss"), counts.last(0, "loss"), counts.previous(0, "loss")) == (2, 2.0, 1.0)
    assert counts.seq(0, "lr") == 0 and counts.last(0, "lr") is None
    counts.advance(0, {"loss": [4.0]}, 0, 1)  # one record: the engine's `feed`
    assert (counts.seq(0, "loss"), counts.last(0, "loss"), counts.previous(0, "loss")) == (3, 4.0, 2.0)
    assert counts.earlier(0, "loss") == 1.0
    assert counts.seq(1, "loss") == 0  # per rank


def _train(step: int, loss: float, grad: float | None = 1.0) -> Record:
    signals = {"loss": loss, "lr": 1e-5}
    if grad is not None:
        signals["grad_norm"] = grad
    return Record(step=step, signals=signals, source="t.log", line_no=step)


def _findings(stream: list[Record]) -> tuple[list, list]:
    each, routed = Engine(make_detectors()), Engine(make_detectors())
    for record in stream:
        each.feed(record)
    routed.feed_all(stream)
    return ([(f.code, f.step) for f in each.finish().findings],
            [(f.code, f.step) for f in routed.finish().findings])


def test_a_finite_norm_between_ends_a_pending_nonfinite_norm():
    # An inf norm next to a live loss waits for the next log; finite norms came between, so the zero loss
    # much later is not "right after" it.
    stream = [_train(s, 2.0 - s / 100) for s in range(1, 20)] + [_train(20, 1.8, math.inf)]
    stream += [_train(s, 1.7) for s in range(21, 40)] + [_train(40, 0.0, 0.5)]
    each, routed = _findings(stream)
    assert each == routed
    engine = Engine(make_detectors())
    engine.feed_all(stream)
    at_20 = [f for f in engine.finish().findings if (f.code, f.step) == ("LOSS001", 20)]
    # Not a death; but a log holding a non-finite norm is never silently healthy: a warning at the end.
    assert [f.severity.name for f in at_20] == ["WARNING"]


def test_the_last_finite_loss_before_zeros_is_read_from_spared_records():
    stream = [_train(s, 2.0 - s / 100) for s in range(1, 30)]
    stream += [_train(s, 0.0, 0.7) for s in range(30, 34)]
    each, routed = _findings(stream)
    assert each == routed
    assert ("LOSS002", 30) in each
