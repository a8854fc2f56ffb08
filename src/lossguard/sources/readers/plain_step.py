"""A script's own step lines: `step 6 loss 3.21 grad_norm 1.70`, `[rank1] step 3 loss 2.1 param_sum 5.2`,
nanoGPT's `iter 100: loss 2.3456, time 12.3ms` and `step 3000: train loss 2.81, val loss 2.93`.

A value behind `val` / `valid` / `eval` (or an `eval_loss=` / `val/loss=` key) is the evaluation's: a
record of its own. When one line gives both, the train value was estimated at the evaluation (nanoGPT
averages it over batches) and is no step's loss: the step's own line after it replaces it.

    >>> [(f.kind, f.step, f.signals) for f in read(b"step 3000: train loss 2.81, val loss 2.93")]
    [('eval', 3000, {'eval_loss': 2.93}), ('train', 3000, {'loss': 2.81})]
    >>> read(b"[rank1] step 3 loss 2.1")[0].rank
    1
    >>> read(b"step 5 val/loss=0.688")[0].kind
    'eval'
"""

from __future__ import annotations

from lossguard.core.signals import to_float
from lossguard.sources import patterns as P
from lossguard.sources.readers.events import as_int
from lossguard.sources.readers.fields import EVAL, Fields, Form
from lossguard.sources.vocabulary import meaning


def read(line: bytes) -> list[Fields] | None:
    match = P.PLAIN_STEP.search(line)
    if not match:
        return None
    signals: dict[str, float] = {}
    evaluated: dict[str, float] = {}
    for prefix, raw_key, raw_value in P.PLAIN_FIELD.findall(line, match.end()):
        name = meaning(raw_key).catalog
        value = to_float(raw_value.decode())
        if name is not None and value is not None:
            is_eval = name == "eval_loss" or (name == "loss" and prefix not in (b"", b"train"))
            (evaluated if is_eval else signals)["eval_loss" if is_eval else name] = value
    if not signals and not evaluated:
        return None
    rank = as_int(match.group(1).decode()) if match.group(1) else None
    step = int(match.group(2))
    out = []
    if evaluated:
        out.append(Fields(Form.PLAIN, evaluated, step, EVAL))
        out[-1].rank = rank
    if signals:
        out.append(Fields(Form.PLAIN, signals, step))
        out[-1].rank, out[-1].estimate = rank, bool(evaluated)
    return out
