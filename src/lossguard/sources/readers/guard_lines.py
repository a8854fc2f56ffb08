"""lossguard's own lines in a job's output: the live guard's findings, its recoveries and its halt.

A run guarded live prints `lossguard: step 2: CRITICAL LOSS001 [nonfinite] loss is NaN ...` and `lossguard:
halting at step 2 on every rank: LOSS001 (nonfinite)` into the job's log (`monitor/sinks.format_finding`). When
the guard stopped the run at the fault, the log may hold nothing else of it (the NaN never reached a log
dict): the guard's report is then the evidence, and `analyze` reports it (detectors/guard_report.py).

    >>> fields = read(b"lossguard: step 2: CRITICAL LOSS001 [nonfinite] loss is NaN at step 2")
    >>> fields.event, fields.step, fields.data["code"], fields.data["signature"], fields.data["severity"]
    ('guard-finding', 2, 'LOSS001', 'nonfinite', 'critical')
    >>> read(b"[rank0]: lossguard: step 7 rank 1: ERROR GRAD002 [nan-weights] grad norm is NaN").data["rank"]
    1
    >>> read(b"lossguard: halting at step 2 on every rank: GRAD001 (nonfinite), LOSS001 (nonfinite)").data
    {'codes': [('GRAD001', 'nonfinite'), ('LOSS001', 'nonfinite')]}
    >>> read(b"my_lossguard: step 2 loss 2.3") is None
    True

A step the guard recovered in place (`recover=True`) is said in one line (monitor/recover.py, replay.py,
snapshots.py write it); it comes back as the same "recovery" event as the events file's line, so that the
log's record of that step (its faulty first attempt, never applied; the Trainer's NaN filter logs a made-up
loss there) is left out, as with the events dir, and the report lists it under `recoveries`:

    >>> fields = read(b"lossguard: recovered at step 4: non-finite loss on rank(s) 1 (LOSS001, nonfinite); "
    ...               b"transient (the replay did not fault): the replay committed; 1 of 3 recoveries ...")
    >>> fields.event, fields.step, fields.data["kind"], fields.data["ranks"], fields.data["steps_lost"]
    ('recovery', 4, 'transient', [1], 0)
    >>> read(b"lossguard: recovered at step 7: non-finite weights on rank(s) 1 (LOSS001, nonfinite); every rank "
    ...      b"rolled back to the snapshot of step 5: 3 step(s) lost, 2 batch(es) skipped; ...").data["steps_lost"]
    3
"""

from __future__ import annotations

import re

from lossguard.sources.readers.fields import Fields, Form

_FINDING = re.compile(rb"(?<![\w.-])lossguard: (?:step (\d+)|run)(?: rank (\d+))?: (INFO|WARNING|ERROR|CRITICAL) "
                      rb"([A-Z]+\d{3})(?: \[([\w-]+)\])? (.*)")
_HALT = re.compile(rb"(?<![\w.-])lossguard: halting at step (\d+) on every rank: (.*)")
_CODE = re.compile(rb"([A-Z]+\d{3}) \(([\w.-]+)\)")
_RECOVERED = re.compile(rb"(?<![\w.-])lossguard: recovered at step (\d+): (.*)")
_CAUSE = re.compile(rb"\(([A-Z]+\d{3}), ([\w-]+)\)")  # `(LOSS001, nonfinite)`
_RANKS = re.compile(rb"on rank\(s\) (\d+(?:, \d+)*)")
_LOST = re.compile(rb"(\d+) step\(s\) lost")
_SAMPLE = re.compile(rb"rank (\d+) position (\d+) hash ([0-9a-f]+)(?: index (\d+))?")
EVENTS = ("guard-finding", "guard-halt", "recovery")  # the events this reader makes
# What each way of recovering says (monitor/recover.py, replay.py, snapshots.py), first match wins:
# (words, kind, steps lost).
_KINDS = ((b"rolled back to the snapshot", "rollback", None), (b"transient (", "transient", 0),
          (b"no supervised token: quarantined", "sample", 1), (b"whose loss alone faulted", "sample", 1),
          (b"reproducible: quarantined", "sample", 0))


def read(line: bytes) -> Fields | None:
    if (match := _FINDING.search(line)) is not None:
        step, rank, severity, code, signature, message = match.groups()
        data = {"code": code.decode(), "severity": severity.decode().lower(),
                "signature": signature.decode() if signature else None,
                "message": message.decode("utf-8", "replace").strip(), "rank": int(rank) if rank else None}
        return Fields.event_of(Form.GUARD, EVENTS[0], data, int(step) if step else None)
    if (match := _HALT.search(line)) is not None:
        codes = [(code.decode(), signature.decode()) for code, signature in _CODE.findall(match.group(2))]
        return Fields.event_of(Form.GUARD, EVENTS[1], {"codes": codes}, int(match.group(1)))
    if (match := _RECOVERED.search(line)) is not None:
        return Fields.event_of(Form.GUARD, EVENTS[2], recovered(int(match.group(1)), match.group(2)),
                               int(match.group(1)))
    return None


def recovered(step: int, text: bytes) -> dict:
    """A recovered line's rest as the report lists a recovery (the events file's fields it can say)."""
    kind, lost = next(((k, n) for words, k, n in _KINDS if words in text), ("held", 1))
    if lost is None:
        lost = int(m.group(1)) if (m := _LOST.search(text)) is not None else None
    cause, ranks = _CAUSE.search(text), _RANKS.search(text)
    samples = [{"rank": int(r), "position": int(p), "hash": h.decode(), "index": int(i) if i else None, "step": step}
               for r, p, h, i in _SAMPLE.findall(text)]
    return {"step": step, "ranks": [int(r) for r in ranks.group(1).split(b", ")] if ranks else [], "kind": kind,
            "samples": samples, "steps_lost": lost, "signature": cause.group(2).decode() if cause else None,
            "code": cause.group(1).decode() if cause else None,
            "action": text.decode("utf-8", "replace").strip()}
