"""mmengine / MMDetection-style lines: `Epoch(train) [1][ 10/100]  lr: 1e-05  loss: 2.3`, `Iter(val) [5/20] ...`,
and mmcv's before them (MMDetection 2.x, PaddleSeg-like forks): `Epoch [1][50/1000]\tlr: 1.000e-02, eta: ...,
loss: 2.3456, grad_norm: 12.3`, `Iter [50/1000]\tlr: ...`. Epochs count from 1; the step is the iteration
counted across them.

    >>> fields = read(b"mmengine - INFO - Epoch(train) [2][10/100]  lr: 1.0e-05  loss: 2.3")
    >>> fields.step, fields.kind, fields.signals
    (110, 'train', {'lr': 1e-05, 'loss': 2.3})
    >>> read(b"Epoch [1/3]  loss: 2.9") is None  # ColossalAI's epoch counter: the generic reader's
    True
    >>> read(b"Iter(val) [5/20]  loss: 2.9").signals
    {'eval_loss': 2.9}
    >>> fields = read(b"mmdet - INFO - Epoch [2][50/1000]\tlr: 1.000e-02, eta: 1:23:45, loss: nan, grad_norm: 12.3")
    >>> fields.step, fields.signals
    (1050, {'lr': 0.01, 'loss': nan, 'grad_norm': 12.3})
"""

from __future__ import annotations

from lossguard.core.signals import to_float
from lossguard.sources import patterns as P
from lossguard.sources.readers.fields import EVAL, TRAIN, Fields, Form
from lossguard.sources.vocabulary import meaning


def read(line: bytes) -> Fields | None:
    match = P.MMENGINE.search(line)
    if not match:
        return None
    _, mode, epoch, mmcv_epoch, index, total = match.groups()
    epoch = epoch or mmcv_epoch
    step = int(index) if epoch is None else (int(epoch) - 1) * int(total) + int(index)
    signals: dict[str, float] = {}
    for raw_key, raw_value in P.MMENGINE_FIELD.findall(line, match.end()):
        name = meaning(raw_key).catalog
        value = to_float(raw_value.decode())
        if name is not None and value is not None:
            signals["eval_loss" if mode == b"val" and name == "loss" else name] = value
    return Fields(Form.MMENGINE, signals, step, EVAL if mode == b"val" else TRAIN)
