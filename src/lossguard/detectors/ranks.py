"""Rank disagreement: replicas that should be identical are not (the guard's fingerprints, live or read back
from its events files, or a `param_sum` a script prints on every rank)."""

from __future__ import annotations

from lossguard.core.findings import Finding, Severity
from lossguard.core.records import TRAIN, Record, from_the_guard
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
        # The guard's fingerprint (a position-weighted sum of norms) and a script's printed `param_sum` (a
        # plain sum) are different quantities: each is compared only with itself across ranks, per step.
        self._step: dict[bool, int | None] = {True: None, False: None}
        self._prints: dict[bool, dict[int, float]] = {True: {}, False: {}}

    def observe(self, record: Record) -> list[Finding]:
        value = record.signals.get("param_fingerprint")
        if record.kind != TRAIN or value is None or record.rank is None:
            return []
        guard = from_the_guard(record)
        if record.step != self._step[guard]:
            self._step[guard], self._prints[guard] = record.step, {}
        prints = self._prints[guard]
        prints[record.rank] = value
        reference_rank = min(prints)
        reference = prints[reference_rank]
        scale = max(abs(reference), 1.0)
        if abs(value - reference) > _REL_TOL * scale or (value != value) != (reference != reference):
            return self.emit(
                f"rank {record.rank}'s weights differ from rank {reference_rank}'s at step {record.step} "
                f"(fingerprint {value!r} vs {reference!r}): the replicas are out of sync",
                record.step, record.rank, fingerprints=dict(prints))
        return []
