"""Keras `model.fit` output (Keras 2 and 3, tf.keras): an `Epoch e/E` line, then the epoch's progress bar.

    Epoch 4/10
    1875/1875 [==============================] - 5s 3ms/step - loss: nan - accuracy: 0.0987 - val_loss: nan
    1875/1875 ━━━━━━━━━━━━━━━━━━━━ 5s 3ms/step - accuracy: 0.0987 - loss: nan       (Keras 3)
    1875/1875 - 5s - loss: nan - accuracy: 0.0987 - 5s/epoch - 3ms/step              (verbose=2)
     100/1875 [>.............................] - ETA: 1:23 - loss: 2.3000            (a bar caught mid-epoch)

The `i/N` counter counts the epoch's batches and starts again every epoch: it is no step. The reader gives
the counter, the epoch of a header line, and the values (`val_loss` as the epoch's evaluation, a record of its
own); the placer numbers them with the epoch above (`StepPlacer.keras`). A terminal's redraws of one bar
(`\\r`, Keras 2's backspaces) are one line here: each redraw is read.

    >>> [(f.counter, f.kind, f.signals) for f in read(
    ...     b"1875/1875 [==============================] - 5s 3ms/step - loss: nan - accuracy: 0.0987 - val_loss: -inf")]
    [((1875, 1875), 'train', {'loss': nan}), ((1875, 1875), 'eval', {'eval_loss': -inf})]
    >>> read(b"1875/1875 \\xe2\\x94\\x81\\xe2\\x94\\x81\\xe2\\x94\\x81 5s 3ms/step - accuracy: 0.9 - loss: 0.2987")[0].signals
    {'loss': 0.2987}
    >>> read(b" 100/1875 [>.....] - ETA: 1:23 - loss: 2.3000")[0].counter
    (100, 1875)
    >>> [(f.epoch, f.signals) for f in read(b"Epoch 4/10")]
    [(4, {})]
    >>> read(b"Epoch 4/10 - loss: 2.3") is None  # another tool's epoch line: the generic reader's
    True
"""

from __future__ import annotations

import re

from lossguard.core.signals import to_float
from lossguard.sources.readers.fields import EVAL, Fields, Form
from lossguard.sources.vocabulary import Role, meaning, put_loss

HEADER = re.compile(rb"\s*Epoch (\d+)/(\d+)\s*")
# The counter and the bar (`[===>...]`, Keras 3's `━━━`, or none with verbose=2), then ` - ` or Keras 3's time.
BAR = re.compile(rb"\s*(\d+)/(\d+|Unknown) +(?:\[[=>.]*\] +|(?:\xe2\x94[\x80\x81])+ +)?(?:- |\d+s )")
PAIR = re.compile(rb" - ([A-Za-z_][\w/.]*): ([-+]?(?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|nan|inf|Infinity|NaN))(?= - |\s*$)")


def read(line: bytes) -> list[Fields] | None:
    if (header := HEADER.fullmatch(line)) is not None:
        fields = Fields(Form.KERAS)
        fields.epoch, fields.epochs = int(header.group(1)), int(header.group(2))
        return [fields]
    out: list[Fields] = []
    for redraw in line.replace(b"\x08", b"").split(b"\r"):
        out.extend(_bar(redraw))
    return out or None


def _bar(text: bytes) -> list[Fields]:
    match = BAR.match(text)
    if match is None:
        return []
    index, total = match.groups()
    train, evaluation = Fields(Form.KERAS), Fields(Form.KERAS, kind=EVAL)
    for raw_key, raw_value in PAIR.findall(text, match.end(2)):
        found, value = meaning(raw_key), to_float(raw_value.decode())
        if value is None:
            continue
        if found.role == Role.LOSS:
            put_loss(train.signals, value, found.loss_rank <= 1)
        elif found.role == Role.EVAL_LOSS:
            evaluation.signals.setdefault("eval_loss", value)
        elif found.catalog is not None and not found.evaluation:
            train.signals.setdefault(found.catalog, value)
    counter = (int(index), int(total) if total.isdigit() else 0)  # `100/Unknown`: an epoch of no known length
    out = [f for f in (train, evaluation) if f.signals]
    for fields in out:
        fields.counter = counter
    return out
