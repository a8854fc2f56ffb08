"""The engine: one path from a record stream to findings, facts and a bounded picture of the run.

Used by `analyze` (records from files), the live monitor (records from the job) and probe (one engine
per arm). A detector that raises is reported once and switched off; the stream goes on.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from lossguard.core.batch import Batch
from lossguard.core.detector import Detector, Plain, Shared
from lossguard.core.facts import RunFacts
from lossguard.core.findings import Finding, Severity
from lossguard.core.records import EVAL, EVENT, TRAIN, Record
from lossguard.core.series import SeriesBook

# Records kept before and after the first warning for the timeline around the onset.
_CONTEXT_BEFORE = 6
_CONTEXT_AFTER = 6
_MAX_FINDINGS = 500  # per code; a dead run can raise one finding per step for a million steps
# Records per batch on `feed_all`'s fast path: big enough that the per-batch work (columns, one column
# test per detector and signal of its `spared_when`) is noise.
_BATCH = 512


@dataclass(slots=True)
class Stats:
    num_train: int = 0
    num_eval: int = 0
    events: collections.Counter = field(default_factory=collections.Counter)
    event_origins: dict = field(default_factory=dict)  # event name -> where it was first read
    ranks: set = field(default_factory=set)
    first_step: int | None = None
    last_step: int | None = None
    steps_are_ordinal: bool = False
    sources: collections.Counter = field(default_factory=collections.Counter)
    # A run summary (HF's `train_loss`, LLaMA-Factory's `train_epoch_loss`) gave a non-finite training loss:
    # training evidence, though it names no step.
    summary_nonfinite: bool = False


@dataclass(slots=True)
class EngineResult:
    findings: list[Finding]
    facts: RunFacts
    stats: Stats
    series: SeriesBook
    onset_window: list[Record]
    num_suppressed: int = 0


class Engine:
    def __init__(self, detectors: list, facts: RunFacts | None = None) -> None:
        # Handed in (lossguard.detectors.make_detectors() for the built-ins): core imports no detector. One
        # that does not derive from Detector (a plugin's observe / finish) runs with every default.
        self.detectors: list[Detector] = [d if isinstance(d, Detector) else Plain(d) for d in detectors]
        # Signal counts and the loss profile (core/detector.py `Shared`), advanced on every train record.
        self.shared = Shared()
        self.counts, self.profile = self.shared.counts, self.shared.profile
        for detector in self.detectors:
            detector.bind(self.shared)
        self.facts = facts or RunFacts()
        self.stats = Stats()
        self.series = SeriesBook()
        self.findings: list[Finding] = []
        self._per_code: collections.Counter = collections.Counter()
        self._suppressed = 0
        self._recent: collections.deque[Record] = collections.deque(maxlen=_CONTEXT_BEFORE)
        self._window: list[Record] | None = None
        self._after_left = _CONTEXT_AFTER
        self._broken: set[str] = set()
        # (signal names, event) -> the detectors that want such a record; see `_route`.
        self._routes: dict[tuple, list[tuple[Detector, int]]] = {}
        # Detectors whose `spared_when` changes with their state (id -> detector): re-read after each record
        # they observe.
        self._changing = {id(d): d for d in self.detectors if d.spared_when_changes}
        self._changing_ids = frozenset(self._changing)
        self._started = False

    # -- feeding -------------------------------------------------------------------------------
    def feed(self, record: Record) -> list[Finding]:
        self._start()
        self._account([record])
        self.profile.mark = None
        if record.kind == TRAIN:
            columns = {name: [value] for name, value in record.signals.items()}
            self.counts.advance(record.rank, columns, 0, 1)
            self.profile.mark = self.profile.advance(record.rank, columns, [record.step], 0, 1).get(0)
        new = self._observe(record)
        if not (record.kind == EVENT and record.event == "facts"):
            self._keep([record], new)
        return self._collect(new)

    def _observe(self, record: Record, only: set[int] | None = None) -> list[Finding]:
        """Every routed detector (or those whose id is in `only`) observes the record."""
        new: list[Finding] = []
        for detector, key in self._route(record):
            if (only is not None and key not in only) or detector.code in self._broken:
                continue
            try:
                new.extend(detector.observe(record))
            except Exception as exc:  # a lossguard bug must not stop the stream
                new.append(self._internal_error(detector, exc))
        return new

    def _route(self, record: Record) -> list[tuple[Detector, int]]:
        """Detectors that declare `wants` (signal and event names) see only matching records: a big
        log's `step=` lines then cost two detector calls, not thirteen. With each its id, which the batch
        path routes by (an id() call per detector and record was a tenth of the engine on a dead log)."""
        key = (tuple(record.signals), record.event)
        route = self._routes.get(key)
        if route is None:
            names = set(record.signals) | {record.event}
            route = [(d, id(d)) for d in self.detectors if d.wants is None or names & d.wants]
            if len(self._routes) < 1024:
                self._routes[key] = route
        return route

    def feed_all(self, records, on_findings: Callable[[Record, list[Finding]], None] | None = None) -> None:
        """Every record, with the same findings and detector state as `feed` one by one; runs of plain
        train records go through `Batch` (see core/batch.py), which is what makes a big log fast.
        `on_findings(record, new)` is called as `feed` would have returned `new` for `record` (live
        callers place their alerts with it)."""
        run: list[Record] = []
        for record in records:
            # Numbers at a known step and nothing else for a detector to read: the batch path's kind.
            if record.kind == TRAIN and record.event is None and not record.data and record.step is not None:
                if run and (len(run) >= _BATCH or record.rank != run[0].rank):
                    self._feed_batch(run, on_findings)
                    run = []
                run.append(record)
                continue
            if run:
                self._feed_batch(run, on_findings)
                run = []
            if (new := self.feed(record)) and on_findings is not None:
                on_findings(record, new)
        if run:
            self._feed_batch(run, on_findings)

    def _start(self) -> None:
        if not self._started:
            self._started = True
            known = self.facts.known()
            if known:  # facts the caller knew up front (--config, --env) reach detectors as an event
                self.feed(Record(step=None, kind=EVENT, event="facts", data=known, source="given"))

    def _feed_batch(self, records: list[Record], on_findings=None) -> None:
        self._start()
        batch = Batch(records)
        self._account(records, batch.steps, batch.columns)
        routed, used = self._route_batch(batch)
        marks = self.profile.advance(batch.rank, batch.columns, batch.steps, 0, len(records))
        if marks:  # records the loss profile marked go to the detectors that read it
            readers = {id(d) for d in self.detectors if d.reads_profile}
            for index in marks:
                routed.setdefault(index, set()).update(readers)
        done = 0
        pending = collections.deque(sorted(routed))
        while pending:  # in order, each record to the detectors it concerns
            index = pending.popleft()
            self.counts.advance(batch.rank, batch.columns, done, index + 1)
            self.profile.mark = marks.get(index)
            record = records[index]
            new = self._observe(record, only=routed[index])
            self._keep(records[done:index + 1], new)
            if (kept := self._collect(new)) and on_findings is not None:
                on_findings(record, kept)
            done = index + 1
            if self._changing_ids and (changing := routed[index] & self._changing_ids):
                pending = self._reroute(batch, routed, used, index, pending, changing)
        self.counts.advance(batch.rank, batch.columns, done, len(records))
        self._keep(records[done:])

    def _route_batch(self, batch: Batch) -> tuple[dict[int, set[int]], dict[int, dict | None]]:
        """Record index -> ids of the detectors that must observe it: a detector with `spared_when`
        (core/detector.py) gets the records that fail one of its tests; one without, every record. Also the
        `spared_when` each detector was routed by (id -> it)."""
        names = batch.columns.keys()
        routed: dict[int, set[int]] = {}
        used: dict[int, dict | None] = {}
        failing: dict[tuple, set[int]] = {}  # (signal, test) -> its records that fail it: detectors share tests
        for detector in self.detectors:
            wants = detector.wants
            if detector.code in self._broken or (wants is not None and names.isdisjoint(wants)):
                continue
            spared = used[id(detector)] = detector.spared_when
            try:
                indices = range(len(batch.records)) if spared is None else \
                    _not_spared(spared, batch.columns, failing)
            except Exception as exc:  # as in `feed`: reported once, the detector switched off
                self._collect([self._internal_error(detector, exc)])
                continue
            for index in indices:
                routed.setdefault(index, set()).add(id(detector))
        return routed, used

    def _reroute(self, batch: Batch, routed: dict, used: dict, index: int, pending: collections.deque,
                 changing: set[int]):
        """A detector whose `spared_when` changes with its state may change it on a record it was handed;
        spared records change no state, so until then the routing held. From the next record on, it gets
        exactly the records that fail its new `spared_when` (and the profile's marks if it reads them): a run
        that opens and closes again costs it one record, not the rest of the batch. `changing`: the ids of
        such detectors that observed record `index`. Returns the records left to visit."""
        rerouted = False
        for key in changing:
            detector = self._changing[key]
            spared = detector.spared_when
            if spared is used.get(key):
                continue
            used[key] = spared
            rerouted = True
            fails = None if spared is None else _not_spared(spared, batch.columns, {})
            for later in range(index + 1, len(batch.records)):
                if fails is None or later in fails:
                    routed.setdefault(later, set()).add(key)
                elif later in routed and not detector.reads_profile:
                    routed[later].discard(key)
        if not rerouted:
            return pending
        return collections.deque(sorted(i for i, ids in routed.items() if i > index and ids))

    def finish(self) -> EngineResult:
        new: list[Finding] = []
        for detector in self.detectors:
            if detector.code in self._broken:
                continue
            try:
                new.extend(detector.finish())
            except Exception as exc:
                new.append(self._internal_error(detector, exc))
        for detector in self.detectors:  # every column has been seen: a rule checks its finding against them
            if detector.code in self._broken:
                continue
            try:
                detector.review()
            except Exception as exc:
                new.append(self._internal_error(detector, exc))
        self._collect(new)
        return EngineResult(
            findings=self.findings,
            facts=self.facts,
            stats=self.stats,
            series=self.series,
            onset_window=self._window or list(self._recent),
            num_suppressed=self._suppressed,
        )

    def snapshot(self) -> EngineResult:
        """The picture so far without calling the detectors' `finish`: the live path (watch) diagnoses this
        after each new finding and keeps feeding; `finish` is still called once at the end."""
        return EngineResult(
            findings=list(self.findings),
            facts=self.facts,
            stats=self.stats,
            series=self.series,
            onset_window=list(self._window or self._recent),
            num_suppressed=self._suppressed,
        )

    # -- bookkeeping -----------------------------------------------------------------------------
    def _account(self, records: list[Record], steps: list | None = None, columns: dict | None = None) -> None:
        """Stats and series for one record, or for a batch run (one rank and kind, every step known, its
        `steps` and `columns` given): the one path both take."""
        stats, first = self.stats, records[0]
        if len({record.source for record in records}) == 1:  # a set is C speed; Counter.update is not
            stats.sources[first.source] += len(records)
        else:
            stats.sources.update(record.source for record in records)
        if first.rank is not None:
            stats.ranks.add(first.rank)
        if first.kind == EVENT:
            stats.events[first.event] += 1
            if first.event not in stats.event_origins and first.where:
                stats.event_origins[first.event] = first.where
            # The caller's own facts come back as a "given" event for the detectors: they are already in
            # self.facts with their origins (file:line, "(DeepSpeed default)"), which must not become "given".
            if first.event == "train-summary" and _nonfinite_training_loss(first.data):
                stats.summary_nonfinite = True
            if first.event == "facts" and first.source != "given":
                for name, value in first.data.items():
                    if hasattr(self.facts, name) and name != "origin":
                        self.facts.set(name, value, first.where or "log")
            return
        if first.kind == TRAIN:
            stats.num_train += len(records)
        elif first.kind == EVAL:
            stats.num_eval += len(records)
        if first.step is None:
            return
        if columns is None:
            steps, columns = [first.step], {name: [value] for name, value in first.signals.items()}
        if stats.first_step is None:
            stats.first_step = first.step
        top = max(steps)
        stats.last_step = top if stats.last_step is None else max(stats.last_step, top)
        stats.steps_are_ordinal = stats.steps_are_ordinal or any(r.step_is_ordinal for r in records)
        for name, column in columns.items():
            if None in column:
                kept = [s for s, v in zip(steps, column) if v is not None]
                column = [v for v in column if v is not None]
            else:
                kept = steps
            self.series.add_many(name, first.rank, kept, column)

    def _keep(self, records: list[Record], new: list[Finding] | tuple = ()) -> None:
        """Records for the timeline around the onset; `new` are the findings the last of them raised."""
        if self._window is None:
            self._recent.extend(records)
            if new and any(f.severity >= Severity.WARNING for f in new):
                self._window = list(self._recent)
        elif self._after_left > 0:
            taken = records[: self._after_left]
            self._window.extend(taken)
            self._after_left -= len(taken)

    def _collect(self, new: list[Finding]) -> list[Finding]:
        kept = []
        for finding in new:
            self._per_code[finding.code] += 1
            if self._per_code[finding.code] > _MAX_FINDINGS:
                self._suppressed += 1
                continue
            kept.append(finding)
        self.findings.extend(kept)
        return kept

    def _internal_error(self, detector: Detector, exc: Exception) -> Finding:
        self._broken.add(detector.code)
        return Finding(
            code="LG000",
            name="lossguard.internal-error",
            severity=Severity.INFO,
            message=f"detector {detector.code} ({detector.name}) failed and was switched off: "
            f"{type(exc).__name__}: {exc}. Please report this; the other detectors ran.",
        )


def _not_spared(spared: dict, columns: dict[str, list], failing: dict[tuple, set[int]]) -> set[int]:
    """Indices of the records that fail some test of a detector's `spared_when`: one C-speed call per signal
    clears a whole column; only a column that fails is looked at value by value, once per batch for each
    (signal, test) pair (`failing` holds them: several detectors test the loss for a zero)."""
    indices: set[int] = set()
    for name, test in spared.items():
        column = columns.get(name)
        if column is None:
            continue
        fails = failing.get((name, test))
        if fails is None:
            fails = failing[(name, test)] = set() if test(column) else \
                {i for i, value in enumerate(column) if value is not None and not test([value])}
        indices |= fails
    return indices


def _nonfinite_training_loss(data: dict) -> bool:
    """A summary's training loss (a key naming a loss, not an evaluation's) is NaN or infinite."""
    return any(isinstance(value, float) and not math.isfinite(value) and "loss" in str(key).lower()
               and "eval" not in str(key).lower() for key, value in data.items())
