"""`watch --halt-on broken` and a finite-loss divergence (LOSS005): the banner at once, the halt only once
the logs after it (`settle_logs`) have not refuted it. A switch to harder data that the model then learns
looks like a divergence for its first logs: no halt (the healthy twin). Weights thrown out of their basin
stay out: halted."""

from __future__ import annotations

import math

from lossguard.detectors.trends import LossDivergence
from lossguard.watch.analyzer import LiveAnalyzer


def _line(loss: float, step: int, lr: float = 1e-4) -> bytes:
    return f"{{'loss': {loss:.4f}, 'grad_norm': 1.5, 'learning_rate': {lr}, 'epoch': {step / 100:.2f}}}\n".encode()


def _losses(shift: bool) -> list[float]:
    """40 logs falling from 2.3 to ~0.1, then a leap to ~5: a new task learnt back down (shift), or a
    plateau near 5 (diverged)."""
    before = [2.3 * math.exp(-i / 12) + 0.05 for i in range(40)]
    after = [5.0 * math.exp(-i / 8) + 0.3 + 0.05 * math.sin(i) if shift else 5.0 + 0.3 * math.sin(i)
             for i in range(40)]
    return before + after


def _feed(losses: list[float], lr_from: int | None = None) -> list:
    """`lr_from`: the LR is 1000x from that step on (a typo'd or exploded LR)."""
    live = LiveAnalyzer(halt_on="broken")
    alerts = []
    for step, loss in enumerate(losses, 1):
        lr = 0.1 if lr_from is not None and step >= lr_from else 1e-4
        alerts += [(step, a) for a in live.feed(_line(loss, step, lr))]
    return alerts


def test_a_switch_to_harder_data_is_announced_but_not_halted():
    alerts = _feed(_losses(shift=True))
    assert any(a.diagnosis.signature == "divergence" for _, a in alerts)  # the banner, at the leap
    assert not any(a.halt for _, a in alerts), [(s, a.diagnosis.verdict, a.halt) for s, a in alerts]


def test_a_divergence_that_stays_up_is_halted_once_its_logs_have_passed():
    alerts = _feed(_losses(shift=False))
    halts = [step for step, a in alerts if a.halt]
    first = next(step for step, a in alerts if a.diagnosis.signature == "divergence")
    assert halts and first < halts[0] <= first + LossDivergence.SETTLE_LOGS + 1, (first, halts)


def test_a_divergence_right_after_the_lr_stepped_up_1000_fold_is_halted_at_once():
    """The LR column explains the leap (no data multiplies the LR): no wait, halted at the finding."""
    alerts = _feed(_losses(shift=False), lr_from=40)
    halts = [step for step, a in alerts if a.halt]
    assert halts and halts[0] <= 41 + LossDivergence._JUMP_STREAK, halts
