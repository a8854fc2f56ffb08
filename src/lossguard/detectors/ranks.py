"""Rank disagreement (live only): replicas that should be identical are not. KNOWLEDGE.md §6.2."""

from __future__ import annotations

from lossguard.core.findings import Finding, Severity
from lossguard.core.records import TRAIN, Record
from lossguard.detectors._base import DetectorBase
from lossguard.detectors.registry import register

_REL_TOL = 1e-6


@register
class RankDesync(DetectorBase):
    """RANK001: the weight fingerprints of the ranks differ at the same step: data-parallel replicas
    have drifted apart (a bad all-reduce, a rank-local update, hardware corruption)."""

    wants = frozenset({"param_fingerprint"})
    code = "RANK001"
    name = "rank.weight-desync"
    signature = "rank-desync"
    severity = Severity.CRITICAL

    def __init__(self) -> None:
        super().__init__()
        self._step: int | None = None
        self._prints: dict[int, float] = {}

    def observe(self, record: Record) -> list[Finding]:
        value = record.signals.get("param_fingerprint")
        if record.kind != TRAIN or value is None or record.rank is None:
            return []
        if record.step != self._step:
            self._step, self._prints = record.step, {}
        self._prints[record.rank] = value
        reference_rank = min(self._prints)
        reference = self._prints[reference_rank]
        scale = max(abs(reference), 1.0)
        if abs(value - reference) > _REL_TOL * scale or (value != value) != (reference != reference):
            return self.emit(
                f"rank {record.rank}'s weights differ from rank {reference_rank}'s at step {record.step} "
                f"(fingerprint {value!r} vs {reference!r}): the replicas are out of sync",
                record.step, record.rank, fingerprints=dict(self._prints))
        return []
