"""The one stream every source, the live monitor and probe produce: step records.

A record is either numbers at a step (`signals`, names from `core.signals`) or a tagged event (`event`
set, e.g. "overflow", "tokenization-mismatch", "config") with its `data`. Detectors never see a
source's own key names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Record kinds: a training log, an evaluation log, or a non-numeric event.
TRAIN = "train"
EVAL = "eval"
EVENT = "event"


@dataclass(slots=True)
class Record:
    step: int | None
    rank: int | None = None
    signals: dict[str, float] = field(default_factory=dict)
    kind: str = TRAIN
    event: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    line_no: int | None = None
    # True when `step` was counted (n-th log line) rather than read from the log.
    step_is_ordinal: bool = False

    @property
    def where(self) -> str:
        """A short location for messages: `file.log:123` style when known."""
        if self.line_no is not None:
            return f"{self.source}:{self.line_no}" if self.source else f"line {self.line_no}"
        return self.source


def event(name: str, step: int | None = None, rank: int | None = None, **data: Any) -> Record:
    return Record(step=step, rank=rank, kind=EVENT, event=name, data=data)


# The live guard's events file of one rank (monitor/sinks.py writes it, sources/lossguard_events.py reads it,
# naming each record by its file).
EVENTS_FILE = "events-rank{rank}.jsonl"


def from_the_guard(record: Record) -> bool:
    """The record was measured by the live guard (live, or read back from its events files), not read from
    a line the job printed: its `param_fingerprint` is the guard's, never a script's `param_sum`."""
    source = record.source or ""
    return source == "live" or (source.startswith("events-rank") and source.endswith(".jsonl"))
