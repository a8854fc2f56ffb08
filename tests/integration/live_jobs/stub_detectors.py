"""Stand-in detectors for the live jobs while `lossguard.detectors` is not on this branch.

Used only when `import lossguard.detectors` fails; they follow the record contract and the DESIGN.md
signature ids so the jobs' expectations hold for the real detectors too.
"""

from __future__ import annotations

import math

from lossguard.core.findings import Finding, Severity


class _Base:
    signature = None

    def finish(self):
        return []

    def _f(self, record, message, severity=Severity.ERROR, rank=None):
        return [Finding(code=self.code, name=self.name, severity=severity, message=message, step=record.step,
                        rank=record.rank if rank is None else rank, signature=self.signature)]


class NonFinite(_Base):
    code, name, signature = "STUB001", "stub.nonfinite", "nonfinite"

    def observe(self, record):
        for key in ("raw_loss", "grad_norm"):
            value = record.signals.get(key)
            if value is not None and not math.isfinite(value):
                return self._f(record, f"{key} is {value}")
        return []


class Masked(_Base):
    code, name, signature = "STUB002", "stub.masked", "masked-labels"

    def observe(self, record):
        if record.signals.get("num_label_tokens") == 0:
            return self._f(record, "no supervised tokens")
        return []


class Overflow(_Base):
    code, name, signature = "STUB003", "stub.overflow", "fp16-overflow"

    def __init__(self):
        self.last = {}
        self.applied = {}

    def observe(self, record):
        skipped = record.signals.get("skipped_steps")
        if skipped is None or record.rank is None:
            return []
        prev = self.last.get(record.rank, 0)
        self.last[record.rank] = skipped
        if skipped > prev and self.applied.get(record.rank, 0) > 0:
            return self._f(record, "overflow skip after applied steps")
        if skipped == prev:
            self.applied[record.rank] = self.applied.get(record.rank, 0) + 1
        return []


class Events(_Base):
    code, name, signature = "STUB004", "stub.no-grad", "no-grad-flow"

    def observe(self, record):
        if record.event in ("no-grad", "trainable-not-in-optimizer"):
            return self._f(record, f"{record.event}: {record.data.get('params')}")
        return []


class Desync(_Base):
    code, name, signature = "STUB005", "stub.desync", "rank-desync"

    def __init__(self):
        self.step = None
        self.prints = {}

    def observe(self, record):
        value = record.signals.get("param_fingerprint")
        if value is None or not math.isfinite(value):
            return []
        if record.step != self.step:
            self.step, self.prints = record.step, {}
        self.prints[record.rank] = value
        if len(set(self.prints.values())) > 1:
            self.prints = {record.rank: value}
            return self._f(record, "replicas differ", rank=None)
        return []


def detectors_or_stubs():
    """None (use the registered detectors) when they exist, else the stubs."""
    try:
        import lossguard.detectors  # noqa: F401

        return None
    except ImportError:
        return [NonFinite(), Masked(), Overflow(), Events(), Desync()]
