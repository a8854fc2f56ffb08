"""Tell-tale warnings and messages (`patterns.EVENT_PATTERNS`): OVERFLOW lines, the loss scale at its floor,
LLaVA's tokenization mismatch, the reentrant-checkpointing warning, a trainable-parameter count ...

    >>> fields = read(b"[deepspeed] OVERFLOW! Rank 1 Skipping step. Attempted loss scale: 65536, reducing to 32768")
    >>> fields.event, fields.data
    ('overflow', {'rank': 1, 'attempted_scale': 65536.0, 'new_scale': 32768.0})
    >>> read(b"WARNING: tokenization mismatch: 512 vs. 509. (ignored)").data
    {'got': 512, 'expected': 509}
    >>> read(b" 14%|#4   | 379/2724 [14:00<86:09, 132.28s/it][deepspeed] OVERFLOW! Skipping step.").bar
    379
    >>> read(b"loss 2.3") is None
    True
"""

from __future__ import annotations

from lossguard.core.signals import to_float
from lossguard.sources import patterns as P
from lossguard.sources import progress
from lossguard.sources.readers.fields import Fields, Form


def read(line: bytes) -> Fields | None:
    """The first event the line holds; None when it holds none."""
    for needle, name, pattern in P.EVENT_NEEDLES:
        if needle in line and (match := pattern.search(line)):
            bar = progress.bar_step(line, match.start())  # the bar the event was printed on, if any
            fields = Fields.event_of(Form.EVENT, name, _data(name, match), bar=bar)
            fields.before = line[: match.start()]
            return fields
    return None


def _data(name: str, match) -> dict:
    groups = [g.decode() if g else None for g in match.groups()]
    if name == "overflow":
        if not match.re.groupindex:  # DeepSpeed's ZeRO loss scaler: rank, attempted, new
            return {"rank": as_int(groups[0]), "attempted_scale": to_float(groups[1]),
                    "new_scale": to_float(groups[2])}
        named = {k: v.decode() if v else None for k, v in match.groupdict().items()}
        return {"attempted_scale": to_float(named.get("attempted")),
                "new_scale": to_float(named.get("new") or named.get("set_to"))}
    if name == "tokenization-mismatch":
        return {"got": as_int(groups[0]), "expected": as_int(groups[1])}
    if name == "trainable-params":
        return {"count": as_int(groups[0].replace(",", ""))}
    if name == "nonfinite-detected":
        return {"batch": as_int(groups[0])}
    return {}


def as_int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None
