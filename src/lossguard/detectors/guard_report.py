"""The live guard's own report, read back from a job's log.

A run guarded by `lossguard.guard()` / the Trainer callback prints each finding and its halt into the job's
output. Halted at the fault, the run may have logged nothing else of it: the NaN step never reached a log
dict, the Trainer never printed its loss. Without this detector such a log reads HEALTHY although the guard
stopped the run for a NaN. The guard saw the tensors; its report is evidence like any log line.
"""

from __future__ import annotations

from lossguard.core.findings import Finding, Severity
from lossguard.core.records import EVENT, Record
from lossguard.detectors._base import DetectorBase
from lossguard.detectors.registry import register


@register
class GuardReport(DetectorBase):
    """GUARD001: the log holds a finding lossguard's live guard printed during the run (`lossguard: step 2:
    CRITICAL LOSS001 [nonfinite] ...`), or its halt line. It is reported with the guard's own code, severity and
    signature in the message, at the step the guard named, so the diagnosis agrees with what the guard saw
    when the log itself does not show the fault. Fix: the fix of the code the guard reported
    (`lossguard explain CODE`); to look at the run's numbers, analyze the guard's events directory
    (`events-rank*.jsonl`) beside the log."""

    wants = frozenset({"guard-finding", "guard-halt"})
    code = "GUARD001"
    name = "guard.reported"
    signature = None
    severity = Severity.ERROR

    def __init__(self) -> None:
        super().__init__()
        self._reported: set[str] = set()  # codes already reported: the halt line repeats the finding lines'

    def observe(self, record: Record) -> list[Finding]:
        if record.kind != EVENT:
            return []
        data = record.data
        if record.event == "guard-finding":
            found = [(data.get("code"), data.get("signature"), data.get("severity"), data.get("message"))]
        elif record.event == "guard-halt":
            found = [(code, signature, "critical", "the guard halted the run on it")
                     for code, signature in data.get("codes", [])]
        else:
            return []
        out = []
        for code, signature, severity, message in found:
            if not isinstance(code, str) or code in self._reported:
                continue
            self._reported.add(code)
            level = Severity[severity.upper()] if severity in {str(s) for s in Severity} else self.severity
            out.append(Finding(code=self.code, name=self.name, severity=level, step=record.step,
                               rank=data.get("rank") if isinstance(data.get("rank"), int) else None,
                               signature=signature if isinstance(signature, str) else None,
                               message=f"lossguard's live guard reported {code} at step {record.step} during the "
                                       f"run: {message}", data={"reported_code": code}))
        return out
