"""The detector contract: everything a detector may declare to the engine, with its default.

A detector sees records one at a time (`observe`) and once more at the end (`finish`), doing O(1) work per
step. The same objects run live (monitor, watch), post hoc (analyze) and over probe arms. The engine reads
the declarations below directly; a detector declares only what differs from the default. The registry of
built-in detectors lives with them (lossguard.detectors.registry): core imports nothing above it.

A class with only `code`, `name`, `signature`, `observe` and `finish` (a plugin's) is still a detector: the
engine wraps it in `Plain`, which keeps every default (every record, nothing spared, nothing bound).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from lossguard.core.counts import SignalCounts
from lossguard.core.findings import Finding
from lossguard.core.profile import LossProfile
from lossguard.core.records import Record

# A column test (core/column_tests.py): True when no value of the column concerns the detector.
ColumnTest = Callable[[list], bool]


@dataclass(slots=True)
class Shared:
    """What the engine keeps once for every detector and advances on every train record, the ones it
    spares a detector included: the signal counts and last values, and the loss profile."""

    counts: SignalCounts = field(default_factory=SignalCounts)
    profile: LossProfile = field(default_factory=LossProfile)


class Detector:
    """Base class of every detector. Subclasses set `code`, `name`, `signature` and implement `observe`."""

    code: str = "?"  # stable, never reused: LOSS001, GRAD002, ...
    name: str = "?"  # dotted: loss.nan-filter-zero
    signature: str | None = None  # the signature (diagnose/signatures.py) this detector reports

    wants: frozenset[str] | None = None
    """The signal and event names the detector reads: the engine routes it only records carrying one of
    them. None: every record."""

    spared_when: dict[str, ColumnTest] | None = None
    """{signal: column test}: a plain train record is spared (not routed to `observe`) when, for every signal
    named here that it carries, the test passes. A spared record must change nothing the detector reports,
    and the detector never infers what one would have done: what it may know of spared records it reads
    from `self.counts` (their counts and last values) and `self.profile`. None: no record is spared."""

    spared_when_changes: bool = False
    """`spared_when` depends on the detector's state (a property). The engine re-reads it after each record
    it routes to the detector (a spared record changes no state, so nothing else can change it). A detector
    with a run of its own open (logs in a row, a value waiting for the next log) declares this and, while
    the run is open, spares no record that could end it."""

    reads_profile: bool = False
    """The detector is also routed the train records the loss profile marks (core/profile.py), and reads
    what the profile held there in `self.profile.mark` (a TrendMark)."""

    def __init__(self) -> None:
        # Alone (unit use) nothing advances these; the engine binds its own. Plain attributes, not a
        # property over `Shared`: observe reads them on every record it is routed.
        self.counts = SignalCounts()
        self.profile = LossProfile()

    def bind(self, shared: Shared) -> None:
        """Called once by the engine before any record: the state it advances for every detector."""
        self.counts, self.profile = shared.counts, shared.profile

    def observe(self, record: Record) -> list[Finding]:
        return []

    def finish(self) -> list[Finding]:
        return []

    predicts: dict[str, str] = {}
    """{column: what the mechanism behind a run-killing finding predicts there}, for every column a log may
    show (`loss`, `grad_norm`, `lr`, `eval_loss`, `reward`, `loss_scale`, ...). A detector whose finding can
    call a run broken declares it, and `review` keeps the verdict only while no column contradicts it."""

    settle_logs: int = 0
    """Logs after its finding within which a column may still contradict it (a loss that comes back down):
    a live halt on the finding waits for them and halts only if `review` then finds no contradiction. 0: the
    finding halts at once (a non-finite loss needs no second look)."""

    def contradiction(self) -> str | None:
        """What a column of this log shows against the fired finding's mechanism, or None."""
        return None

    def review(self) -> None:
        """Called by the engine once, after every detector's `finish`: where a column the log shows
        contradicts what this detector's finding claims, the finding stops calling the run broken."""


class Plain(Detector):
    """A detector object that does not derive from `Detector` (a plugin's `observe` / `finish` only), with
    every default: it is routed every record and bound nothing."""

    def __init__(self, inner) -> None:
        super().__init__()
        self.inner = inner
        self.code, self.name = inner.code, inner.name
        self.signature = inner.signature

    def observe(self, record: Record) -> list[Finding]:
        return self.inner.observe(record)

    def finish(self) -> list[Finding]:
        return self.inner.finish()
