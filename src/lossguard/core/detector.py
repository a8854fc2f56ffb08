"""The streaming detector protocol. The registry of built-in detectors lives with them
(lossguard.detectors.registry): the engine is handed its detectors and core imports nothing above it.

A detector sees records one at a time (`observe`) and once more at the end (`finish`), doing O(1)
work per step. The same objects run live (monitor, watch), post hoc (analyze) and over probe arms.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from lossguard.core.findings import Finding
from lossguard.core.records import Record


@runtime_checkable
class Detector(Protocol):
    code: str  # stable, never reused: LOSS001, GRAD002, ...
    name: str  # dotted: loss.nan-filter-zero
    signature: str | None  # the DESIGN.md signature this detector reports
    # Optional `wants: frozenset[str]`: the signal and event names it reads. The engine then routes
    # only records carrying one of them to it; without `wants` it sees every record.
    # Optional `calm = {signal: column_test}` (core/calm.py): the engine routes it only the records that
    # fail a test; what it must know about the others it reads from the bound SignalCounts.
    # Optional `reads_profile = True`: it is also routed the train records the engine's loss profile
    # marks (core/profile.py) and reads their `Reading` from the bound profile.

    def observe(self, record: Record) -> list[Finding]: ...

    def finish(self) -> list[Finding]: ...
