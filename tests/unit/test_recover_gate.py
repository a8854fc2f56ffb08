"""The gate's decision from gathered rows and from the reduced summary (above the world-size threshold)."""

from __future__ import annotations

import math
import random

import pytest

torch = pytest.importorskip("torch")

from lossguard.monitor import summary, wire  # noqa: E402
from lossguard.monitor.jump import NATS, RELATIVE, SPREADS, WARMUP  # noqa: E402
from lossguard.monitor.options import RecoverOptions  # noqa: E402
from lossguard.monitor.recover import JUMP, Gate  # noqa: E402

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


def test_a_batch_left_empty_is_skipped_before_any_fault_spending_no_budget():
    """A rank whose batch held only quarantined samples says so in its row (with no label token, so a
    summarised step gathers the rows): every rank skips the step; no fault, no budget, no loss history."""
    emptied = LAYOUT.encode(wire.StepValues(raw_loss=math.nan, emptied=True, lrs=[1e-3]), torch.device("cpu")).tolist()
    assert wire.emptied(emptied) and not wire.emptied(_row())
    assert "zero fewest label tokens" in summary.reasons(summary.of_rows(LAYOUT, [_row(), emptied]), None)
    gate = Gate(RecoverOptions(budget=1, window=10))
    for step in (1, 2, 3):
        hold = gate.judge(step, [_row(), emptied], None)
        assert hold.skip and not hold.give_up and hold.ranks == [1]
    assert gate.num_held == 0 and not gate.held_steps and gate.losses.bound() is None
    assert gate.skip_event(hold)["type"] == "skip"
    assert gate.judge(4, [_row(loss=math.nan), _row()], None).give_up is False  # the budget is whole


# -- the loss jump (monitor/jump.py) ----------------------------------------------------------------------

ABNORMAL = 1000.0  # a gradient norm a thousand times the run's own (1.0): an abnormal update


def _run(gate, losses, start=1, abnormal=True):
    """Feed one loss per step (the same on two ranks unless a list is given); the steps held. Every step's
    gradient norm is 1.0, except (with `abnormal`) a step whose loss is above the gate's loss limit: there
    the update is abnormal too (ABNORMAL), as with a garbage batch or a blown-up step."""
    held = []
    for step, loss in enumerate(losses, start):
        per_rank = loss if isinstance(loss, list) else [loss, loss]
        bound = gate.losses.bound()
        high = abnormal and bound is not None and max(per_rank) > bound[2]
        hold = gate.judge(step, [_row(loss=value, grad=ABNORMAL if high else 1.0) for value in per_rank], None)
        if hold is not None:
            held.append((step, hold))
    return held


def test_a_flat_loss_then_a_jump_is_held_at_the_jump_on_its_rank():
    gate = Gate(RecoverOptions())
    held = _run(gate, [2.0] * 30 + [[2.0, 100.0]] + [2.0] * 5)
    assert [step for step, _ in held] == [31]
    hold = held[0][1]
    assert hold.signature == "loss-spike" and hold.code == "LOSS006" and hold.ranks == [1]
    fault = hold.faults[0]
    assert fault["fault"] == JUMP and fault["values"] == {1: 100.0} and fault["loss"] == 100.0
    assert fault["typical"] == 2.0 and fault["spread"] == 0.0  # a flat loss: the floors decide
    assert fault["limit"] == 2.0 + RELATIVE * 2.0
    event = gate.event(hold)
    assert event["signature"] == "loss-spike" and event["faults"][0]["typical"] == 2.0


def test_the_floors_hold_a_flat_run_below_them():
    """Zero spread: just under 3x the typical value commits, just over it holds; near zero, half a nat."""
    assert _run(Gate(RecoverOptions()), [2.0] * 25 + [5.99]) == []
    assert len(_run(Gate(RecoverOptions()), [2.0] * 25 + [6.01])) == 1
    assert _run(Gate(RecoverOptions()), [0.01] * 25 + [0.01 + NATS - 0.01]) == []
    assert len(_run(Gate(RecoverOptions()), [0.01] * 25 + [0.01 + NATS + 0.01])) == 1


def test_during_the_warm_up_only_a_divergence_from_the_first_steps_is_held():
    """Before WARMUP steps the spread is unknown: only a loss EARLY_RATIO times the first steps' with an
    exploding norm is held (an LR far too high), a 100x loss is not."""
    assert _run(Gate(RecoverOptions()), [2.0] * (WARMUP - 1) + [200.0]) == []
    assert [step for step, _ in _run(Gate(RecoverOptions()), [2.0] * WARMUP + [200.0])] == [WARMUP + 1]
    diverging = [4.4] + [27000.0] * 6  # loss 4.4, then 6000x from the second step on
    assert [step for step, _ in _run(Gate(RecoverOptions(budget=10)), diverging)] == [2, 3, 4, 5, 6, 7]
    # its healthy twin: the same loss with an ordinary update is not held; nor a steep fall
    assert _run(Gate(RecoverOptions()), diverging, abnormal=False) == []
    assert _run(Gate(RecoverOptions()), [4.4 * 0.5 ** step for step in range(WARMUP)]) == []


def test_a_jump_with_an_ordinary_update_is_data_and_never_held():
    """A loss far above the run's spread whose gradient norm is the run's usual one: committed."""
    assert _run(Gate(RecoverOptions()), [2.0] * 30 + [[2.0, 100.0]] + [2.0] * 5, abnormal=False) == []
    gate = Gate(RecoverOptions())  # the norm 2.5x its usual size: within the norm's margin (3x)
    for step in range(1, 31):
        assert gate.judge(step, [_row(loss=2.0, grad=1.0)] * 2, None) is None
    assert gate.judge(31, [_row(loss=40.0, grad=2.5)] * 2, None) is None
    assert gate.judge(32, [_row(loss=40.0, grad=3.5)] * 2, None) is not None  # its twin, held


def test_a_shift_that_persists_becomes_the_new_baseline():
    """A switch to harder data: the loss 4x from step 31 on, the norm 2x; never held, and the limit
    follows the new level within half a window."""
    gate = Gate(RecoverOptions())
    for step in range(1, 31):
        assert gate.judge(step, [_row(loss=1.0, grad=1.0)] * 2, None) is None
    for step in range(31, 80):
        assert gate.judge(step, [_row(loss=4.0 + 0.01 * (step % 3), grad=2.0)] * 2, None) is None, step
    typical, _, limit = gate.losses.bound()
    assert typical >= 4.0 and limit > 12.0


def test_a_noisy_healthy_run_is_never_held():
    """Seeded noise (Gaussian and heavy-tailed, several seeds, two ranks) around a slowly falling curve."""
    for seed in range(8):
        rng = random.Random(seed)
        losses = []
        for step in range(2000):
            curve = 1.0 + 2.0 * math.exp(-step / 400)
            # odd seeds add a right-skewed tail: a few batches far harder than the rest, as real data has
            losses.append([max(curve + rng.gauss(0, 0.15) + (0.2 * rng.expovariate(1.0) if seed % 2 else 0.0), 0.0)
                           for _ in range(2)])
        assert _run(Gate(RecoverOptions()), losses) == [], seed


def test_a_noisy_run_is_judged_by_its_own_spread():
    """Losses swinging widely around 2.0: the spread term sets the limit, above the 3x floor."""
    swings = [2.0 + (1.0 if step % 2 else -1.0) * (0.5 + 0.5 * (step % 3)) for step in range(40)]
    gate = Gate(RecoverOptions())
    assert _run(gate, swings + [9.0]) == []  # over 3x the typical loss, within ten spreads of it
    typical, spread, limit = gate.losses.bound()
    assert limit == typical + SPREADS * spread > 3 * typical
    assert len(_run(gate, [limit + 0.1], start=42)) == 1


def test_a_steep_smooth_early_descent_is_never_held():
    losses = [10.0 * math.exp(-step / 15) + 0.3 for step in range(300)]
    assert _run(Gate(RecoverOptions()), losses) == []
    rising = [1.0 + 0.01 * step for step in range(300)]  # a slow climb (an LR warm-up's bump) is no jump
    assert _run(Gate(RecoverOptions()), rising) == []


def test_a_held_steps_loss_enters_the_history_once_warm():
    gate = Gate(RecoverOptions(budget=5, window=100))
    _run(gate, [2.0] * 30)
    before = list(gate.losses.recent)
    assert len(_run(gate, [50.0, 50.0, 50.0], start=31)) == 3  # held every time: three outliers move no median
    assert list(gate.losses.recent) == [*before, 50.0, 50.0, 50.0][-len(gate.losses.recent):]
    early = Gate(RecoverOptions())  # before the warm-up a held value does not become the baseline
    assert len(_run(early, [4.4, 27000.0])) == 1 and list(early.losses.recent) == [4.4]


def test_rows_and_summary_agree_on_the_jump():
    """The same history and the same decision, from the rows and from the reduced summary (its max)."""
    by_rows, by_summary = Gate(RecoverOptions()), Gate(RecoverOptions())
    rng = random.Random(3)
    series = [[2.0 + rng.gauss(0, 0.1) for _ in range(3)] for _ in range(40)] + [[2.0, 2.1, 40.0], [2.0, 2.1, 2.2]]
    for step, losses in enumerate(series, 1):
        rows = [_row(loss=value, grad=ABNORMAL if step == 41 else 1.0) for value in losses]
        from_rows = by_rows.judge(step, rows, None)
        from_summary = by_summary.judge(step, None, summary.of_rows(LAYOUT, rows))
        assert (from_rows is None) == (from_summary is None), step
        if from_rows is not None:
            assert step == 41 and from_rows.ranks == [2] and from_summary.signature == from_rows.signature
            assert from_summary.faults[0]["loss"] == from_rows.faults[0]["loss"] == 40.0
            assert from_summary.faults[0]["limit"] == from_rows.faults[0]["limit"]
    assert list(by_rows.losses.recent) == list(by_summary.losses.recent)


def test_a_non_finite_fault_comes_before_a_jump():
    gate = Gate(RecoverOptions())
    _run(gate, [2.0] * 25)
    hold = gate.judge(26, [_row(loss=math.nan, grad=ABNORMAL), _row(loss=90.0, grad=ABNORMAL)], None)
    assert [f["fault"] for f in hold.faults] == ["non-finite loss", JUMP]
    assert hold.signature == "nonfinite" and hold.ranks == [0]


def test_a_rank_whose_faults_keep_vanishing_on_replay_becomes_a_suspect_device():
    gate = Gate(RecoverOptions(budget=5, window=10))
    assert gate.suspects(3, [1]) == {}  # once: a one-off
    assert gate.suspects(5, [0]) == {}  # another rank once: nothing points at either device
    assert gate.suspects(8, [1]) == {1: 2}  # rank 1 again within the window
    assert gate.suspects(30, [1]) == {}  # outside the window: counted afresh


# -- a dynamic loss scaler's overflow (torch.amp GradScaler under Guard and Lightning) ----------------------

def _scaled_row(loss=2.0, grad=1.0):
    values = wire.StepValues(raw_loss=loss, grad_norm=grad, loss_scale=65536.0, lrs=[1e-3])
    return LAYOUT.encode(values, torch.device("cpu")).tolist()


def test_a_scaler_overflow_is_the_scalers_business_never_a_fault_nor_budget():
    gate = Gate(RecoverOptions(budget=1, window=100))
    for step in range(1, 6):  # five start-up overflows in a row: none held, no budget used
        rows = [_scaled_row(grad=math.inf), _scaled_row(grad=math.nan)]
        assert gate.judge(step, rows, None) is None
        assert gate.judge(step, None, summary.of_rows(LAYOUT, rows)) is None
    assert gate.num_held == 0 and not gate.held_steps
    # its twins: the same norm without a scaler is held; a non-finite loss under a scaler is held too
    assert Gate(RecoverOptions()).judge(1, [_row(grad=math.inf)] * 2, None).signature == "nonfinite"
    held = Gate(RecoverOptions()).judge(1, [_scaled_row(loss=math.nan, grad=math.inf), _scaled_row(grad=math.inf)],
                                        None)
    assert held is not None and [f["fault"] for f in held.faults] == ["non-finite loss", "non-finite gradient norm"]


def test_a_deepspeed_gate_leaves_a_non_finite_partition_norm_beside_a_finite_loss_to_deepspeed():
    """Under a DeepSpeed gate (`engine_overflow`) each rank sends its gradient partition's norm before the
    step: a non-finite one beside a finite loss is DeepSpeed's own overflow check's (it skips the step, fp16
    lowers its scale), from the rows and from the summary alike; beside a non-finite loss the step is held;
    without the flag (Guard, no scaler) the same row is held."""
    overflow = [_row(), _row(grad=math.inf)]
    for engine in (True, False):
        gate = Gate(RecoverOptions(), engine_overflow=engine)
        assert (gate.judge(5, overflow, None) is None) is engine
        assert (Gate(RecoverOptions(), engine_overflow=engine).judge(
            5, None, summary.of_rows(LAYOUT, overflow)) is None) is engine
    held = Gate(RecoverOptions(), engine_overflow=True).judge(5, [_row(), _row(loss=math.nan, grad=math.nan)], None)
    assert held is not None and held.ranks == [1] and held.signature == "nonfinite"


def test_a_deepspeed_gate_commits_a_loss_jump_whose_partition_norm_is_ordinary():
    """A switch to harder data under DeepSpeed: the loss leaps far above the run's spread while the highest
    partition norm stays ordinary: committed (the loss alone held it before the gate had a norm there)."""
    gate = Gate(RecoverOptions(), engine_overflow=True)
    for step in range(1, WARMUP + 2):
        assert gate.judge(step, [_row(loss=0.05 + 0.001 * (step % 3)), _row(loss=0.05, grad=0.8)], None) is None
    assert gate.judge(WARMUP + 2, [_row(loss=8.0, grad=1.5), _row(loss=8.2, grad=1.4)], None) is None
    hold = gate.judge(WARMUP + 3, [_row(loss=9.0, grad=ABNORMAL), _row(loss=9.0)], None)
    assert hold is not None and hold.signature == "loss-spike"  # an abnormal update beside it still is held
