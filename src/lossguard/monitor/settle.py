"""Halts that wait for the column that could contradict them (`Detector.settle_logs`).

A finding is reported the moment its detector fires. Halting on it is another matter for a rule whose
mechanism a later column can still refute: a loss that leaps when the data turns harder reads as a
divergence for its first logs, and only the logs after it (the model learning the new data) tell the two
apart. Such a halt waits `settle_logs` logs, then goes through only if the detector's `contradiction()`
finds nothing against it; otherwise the finding is reviewed (demoted, with the reason) and the run goes on.
The countdown advances once per analysed step on every rank alike: the detectors see the same gathered
rows everywhere, so every rank halts, or does not, at the same step.
"""

from __future__ import annotations

from lossguard.core.findings import Finding
from lossguard.monitor.sinks import say


class Settling:
    def __init__(self, detectors: list) -> None:
        self._by_code = {d.code: d for d in detectors}
        self._waiting: dict[str, list] = {}  # code -> [finding, logs still to wait]

    @property
    def waiting(self) -> bool:
        return bool(self._waiting)

    def due(self, hits: list[Finding]) -> tuple[list[Finding], list[tuple[Finding, str]]]:
        """(the findings that halt now, [(finding, why) for each waiting halt that a column refuted]) after
        one more analysed step; `hits` are the step's new findings that match `halt_on`."""
        now: list[Finding] = []
        for finding in hits:
            wait = getattr(self._by_code.get(finding.code), "settle_logs", 0)
            if wait > 0 and finding.code not in self._waiting:
                self._waiting[finding.code] = [finding, wait + 1]  # counted down below, this step included
            elif wait <= 0:
                now.append(finding)
        refuted = []
        for code, entry in list(self._waiting.items()):
            entry[1] -= 1
            if entry[1] > 0:
                continue
            del self._waiting[code]
            detector = self._by_code[code]
            why = detector.contradiction()
            if why is None:
                now.append(entry[0])
            else:
                detector.review()  # the finding says why it is no dead run, as `analyze` would
                refuted.append((entry[0], why))
        return now, refuted


def say_refuted(step: int, refuted: list[tuple[Finding, str]], jsonl, console: bool) -> None:
    """A halt that waited for its finding to settle, and the logs since refuted it: the run goes on."""
    for finding, why in refuted:
        if jsonl is not None:
            jsonl.write({"type": "halt-waived", "step": step, "code": finding.code, "finding_step": finding.step,
                         "why": why})
        if console:
            say(f"lossguard: step {step}: no halt on {finding.code} ({finding.signature or finding.name}) from "
                f"step {finding.step}: {why}")
