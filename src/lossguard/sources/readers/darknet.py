"""darknet (pjreddie's and AlexeyAB's YOLO trainer): one line per iteration, and per-layer region lines.

    1000: 2.345678, 2.456789 avg loss, 0.001000 rate, 3.200000 seconds, 64000 images, 10.2 hours left
    1: 719.326843, 719.326843 avg, 0.000000 rate, 4.582107 seconds, 64 images               (pjreddie)
    v3 (mse loss, Normalizer: (iou: 0.75, cls: 1.00) Region 82 Avg (IOU: 0.000000, ...), count: 0, ...,
    total_loss = 0.000000

The iteration line gives the step, the batch's loss (the running `avg` after it follows the loss) and the
learning rate. C's printf writes a NaN `-nan` (`-nan(ind)` on Windows). A region line describes one YOLO layer
on one sub-batch: its IOU reads `-nan` and its `total_loss` 0 whenever no object falls in that layer's scale
(`count: 0`), in healthy runs, so it is read as nothing (an empty list), never as the step's loss.

    >>> [(f.step, f.signals) for f in read(b" 1000: 2.345678, 2.456789 avg loss, 0.001000 rate, 3.2 seconds, 64000 images")]
    [(1000, {'loss': 2.345678, 'lr': 0.001})]
    >>> read(b"1200: -nan, -nan avg loss, 0.001000 rate, 3.2 seconds, 76800 images")[0].signals
    {'loss': nan, 'lr': 0.001}
    >>> read(b"7: -nan(ind), -nan(ind) avg, 0.000000 rate, 4.5 seconds, 448 images")[0].signals
    {'loss': nan, 'lr': 0.0}
    >>> read(b"v3 (mse loss, Normalizer: (iou: 0.75, cls: 1.00) Region 82 Avg (IOU: -nan), count: 0, total_loss = 0.0")
    []
    >>> read(b"Loaded: 0.000035 seconds") is None
    True
"""

from __future__ import annotations

import re

from lossguard.core.signals import to_float
from lossguard.sources.readers.fields import Fields, Form

_VALUE = rb"([-+]?[\w.]+)(?:\((?:ind|snan|qnan)\))?"
ITERATION = re.compile(rb"\s*(\d+): " + _VALUE + rb", " + _VALUE + rb" avg(?: loss)?, " + _VALUE + rb" rate, ")
REGION = re.compile(rb"\bRegion (?:\d+ )?Avg\b")


def read(line: bytes) -> list[Fields] | None:
    match = ITERATION.match(line)
    if match is None:
        return [] if REGION.search(line) else None
    step, loss, _, rate = match.groups()
    signals = {name: value for name, raw in (("loss", loss), ("lr", rate))
               if (value := to_float(raw.decode())) is not None}
    return [Fields(Form.DARKNET, signals, int(step))] if "loss" in signals else None
