"""Megatron-LM's iteration line: ` iteration       10/     100 | ... | lm loss: 2.3E+00 | grad norm: 1.2 |`.

`number of skipped iterations` counts the skips of its logging interval; the placer sums them into the
catalog's cumulative `skipped_steps`. Megatron prints `lm loss` only when the interval's average is `> 0.0`, so a
NaN loss leaves a line without it (and `number of nan iterations: 0` where no NaN check runs, as in bf16); the
placer reads such a line, in a log whose lines had a loss, as a NaN loss (`StepPlacer._megatron_vanished`).

    >>> fields = read(b" iteration       10/     100 | learning rate: 1.0E-05 | lm loss: 2.3E+00 | "
    ...               b"number of skipped iterations:   1 |")
    >>> fields.step, fields.signals
    (10, {'lr': 1e-05, 'loss': 2.3, 'skipped_steps': 1.0})
"""

from __future__ import annotations

from lossguard.core.signals import to_float
from lossguard.sources import patterns as P
from lossguard.sources.readers.fields import Fields, Form
from lossguard.sources.vocabulary import meaning


def read(line: bytes) -> Fields | None:
    match = P.MEGATRON.search(line)
    if not match:
        return None
    signals: dict[str, float] = {}
    for raw_key, raw_value in P.MEGATRON_FIELD.findall(line):
        key, value = raw_key.decode().strip(), to_float(raw_value.decode())
        if value is not None and (name := meaning(key).catalog) is not None:
            signals[name] = value  # `skipped_steps` here is this interval's count, not yet cumulative
    return Fields(Form.MEGATRON, signals, int(match.group(1)))
