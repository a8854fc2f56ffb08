"""mmengine / MMDetection-style lines: `Epoch(train) [1][ 10/100]  lr: 1e-05  loss: 2.3`, `Iter(val) [5/20] ...`.

    >>> fields = read(b"mmengine - INFO - Epoch(train) [2][10/100]  lr: 1.0e-05  loss: 2.3")
    >>> fields.step, fields.kind, fields.signals
    (110, 'train', {'lr': 1e-05, 'loss': 2.3})
    >>> read(b"Iter(val) [5/20]  loss: 2.9").signals
    {'eval_loss': 2.9}
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
    _, mode, epoch, index, total = match.groups()
    step = int(index) if epoch is None else (int(epoch) - 1) * int(total) + int(index)
    signals: dict[str, float] = {}
    for raw_key, raw_value in P.MMENGINE_FIELD.findall(line, match.end()):
        name = meaning(raw_key).catalog
        value = to_float(raw_value.decode())
        if name is not None and value is not None:
            signals["eval_loss" if mode == b"val" and name == "loss" else name] = value
    return Fields(Form.MMENGINE, signals, step, EVAL if mode == b"val" else TRAIN)
