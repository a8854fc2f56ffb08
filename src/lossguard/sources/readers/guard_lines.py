"""lossguard's own lines in a job's output: the live guard's findings and its halt.

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
"""

from __future__ import annotations

import re

from lossguard.sources.readers.fields import Fields, Form

_FINDING = re.compile(rb"(?<![\w.-])lossguard: (?:step (\d+)|run)(?: rank (\d+))?: (INFO|WARNING|ERROR|CRITICAL) "
                      rb"([A-Z]+\d{3})(?: \[([\w-]+)\])? (.*)")
_HALT = re.compile(rb"(?<![\w.-])lossguard: halting at step (\d+) on every rank: (.*)")
_CODE = re.compile(rb"([A-Z]+\d{3}) \(([\w.-]+)\)")
EVENTS = ("guard-finding", "guard-halt")  # the events this reader makes


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
    return None
