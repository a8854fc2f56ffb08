"""The gate's decision from gathered rows and from the reduced summary (above the world-size threshold)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from lossguard.monitor import summary, wire  # noqa: E402
from lossguard.monitor.options import RecoverOptions  # noqa: E402
from lossguard.monitor.recover import Gate  # noqa: E402

LAYOUT = wire.Layout(num_lr=1, groups=("all",))


def _row(loss=2.0, grad=1.0, fewest=8.0):
    values = wire.StepValues(raw_loss=loss, grad_norm=grad, num_label_tokens=16.0, min_label_tokens=fewest, lrs=[1e-3])
    return LAYOUT.encode(values, torch.device("cpu")).tolist()


def test_rows_and_summary_agree_on_each_fault():
    for faulty, expect in (({"loss": math.nan}, "nonfinite"), ({"grad": math.inf}, "nonfinite"),
                           ({"fewest": 0.0}, "masked-labels")):
        rows = [_row(), _row(**faulty), _row()]
        held = Gate(RecoverOptions()).judge(5, rows, None)
        assert held is not None and held.ranks == [1] and held.signature == expect
        from_summary = Gate(RecoverOptions()).judge(5, None, summary.of_rows(LAYOUT, rows))
        assert from_summary is not None and from_summary.signature == expect
    assert Gate(RecoverOptions()).judge(5, [_row(), _row()], None) is None


def test_budget_counts_within_the_window_then_gives_up():
    gate = Gate(RecoverOptions(budget=2, window=10))
    bad = [_row(loss=math.nan)]
    assert [gate.judge(s, bad, None).give_up for s in (1, 2, 3)] == [False, False, True]
    assert gate.judge(12, bad, None).give_up is False  # steps 1 and 2 left the window
