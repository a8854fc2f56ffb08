"""timm's `train.py` lines: `Train: 0 [  50/1251 (  4%)]  Loss: 6.912 (6.93)  Time: ...  LR: 1.000e-05  Data: ...`
and its evaluation's `Test: [  48/48]  Time: ...  Loss:  0.8214 (1.1025)  Acc@1: ...`.

The counter counts the epoch's batches and starts again each epoch; epochs count from 0, so the step is
`epoch * N + i`. A value is followed by its running average in parentheses: a training line's own value is the
batch's loss; an evaluation line's average is the evaluation's loss so far (its last line, the whole set's).
An evaluation line names no step: it is at the last training step (`StepPlacer.numbered`).

    >>> [(f.step, f.signals) for f in read(b"Train: 2 [ 600/1251 ( 48%)]  Loss: nan (nan)  Time: 0.312s,  820.51/s  "
    ...                                    b"(0.320s,  800.12/s)  LR: 1.000e-05  Data: 0.012 (0.015)")]
    [(3102, {'loss': nan, 'lr': 1e-05})]
    >>> [(f.step, f.kind, f.signals) for f in read(b"Test: [  48/48]  Time: 0.1 (0.2)  Loss:  0.8214 (1.1025)  "
    ...                                             b"Acc@1: 81.2500 (75.1230)")]
    [(None, 'eval', {'eval_loss': 1.1025})]
"""

from __future__ import annotations

import re

from lossguard.core.signals import to_float
from lossguard.sources.readers.fields import EVAL, Fields, Form

LINE = re.compile(rb"\b(?:Train: (\d+)|Test(?: \(EMA\))?:) \[\s*(\d+)/(\d+)")
_NUMBER = rb"([-+]?(?:\d[\d.]*(?:[eE][-+]?\d+)?|nan|inf))"
LOSS = re.compile(rb"\bLoss:\s+" + _NUMBER + rb"(?:\s+\(\s*" + _NUMBER + rb"\))?")
LR = re.compile(rb"\bLR: " + _NUMBER)


def read(line: bytes) -> list[Fields] | None:
    match = LINE.search(line)
    loss = LOSS.search(line) if match else None
    if loss is None:
        return None
    epoch, index, total = match.groups()
    if epoch is None:  # an evaluation: the running average over the batches evaluated so far
        value = to_float((loss.group(2) or loss.group(1)).decode())
        return None if value is None else [Fields(Form.TIMM, {"eval_loss": value}, None, EVAL)]
    value = to_float(loss.group(1).decode())
    if value is None:
        return None
    signals = {"loss": value}
    if (lr := LR.search(line)) is not None and (value := to_float(lr.group(1).decode())) is not None:
        signals["lr"] = value
    return [Fields(Form.TIMM, signals, int(epoch) * int(total) + int(index))]
