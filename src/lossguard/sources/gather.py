"""The input gatherer: PATH... -> inputs read once each -> one record stream on the run's steps.

A pipe given as a path (`<(ssh host cat train.log)`, a FIFO) or `-` is copied once to a private temporary
file, so that sniffing its head and parsing it do not need two reads of something that can be read only
once. A directory gives every log of the run; when several of them carry numbers (trainer_state.json and
the stdout log), they are merged on the run's steps: a step both show keeps each signal's value from the
most precise source unless the other one shows it non-finite (a failure is never outvoted); steps only one
shows are kept. A log that names no step numbers is aligned with the other by position (HF prints each log
dict when it appends it to `log_history`). The report says which files were used, which skipped, and why.
"""

from __future__ import annotations

import math
import stat
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from lossguard.core.records import EVENT, TRAIN, Record
from lossguard.sources import beside, trackers
from lossguard.sources.base import SourceError
from lossguard.sources.lossguard_events import LossguardEventsSource
from lossguard.sources.registry import CHECKPOINT, SKIP_NAMES, SKIP_SUFFIXES, SOURCES, Input, sniff
from lossguard.sources.scan import MAX_LINE, ScanCounts
from lossguard.sources.structured import JsonLinesSource
from lossguard.sources.text_log import TextLogSource, parse_file

if TYPE_CHECKING:
    import tempfile


@dataclass
class Gathering:
    """What was read and what was left out, for the report."""

    used: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "path: why"
    unread: list[str] = field(default_factory=list)  # inputs of the run that could not be read: "path: why"
    guard_off: list[str] = field(default_factory=list)  # the live guard stopped analysing: "at step N: why"
    recoveries: list[dict] = field(default_factory=list)  # steps the live guard recovered (the report's `recoveries`)
    events_first_step: int | None = None  # the first step in the events dir read beside a lone log
    # That dir's committed losses by step and its name: its recoveries count only once the log's own losses
    # match them (`_without_recovered`); another run's dir in the same folder does not.
    events_losses: dict[int, float] = field(default_factory=dict)
    events_dir: str = ""
    notes: list[str] = field(default_factory=list)  # which run of a tracker's store was read (the CLI: stderr)
    counts: ScanCounts = field(default_factory=ScanCounts)
    _spool: tempfile.TemporaryDirectory | None = None

    def incomplete_reasons(self) -> list[str]:
        reasons = []
        if self.counts.cut_lines:
            half = MAX_LINE >> 11
            reasons.append(f"{self.counts.cut_lines} line(s) longer than {MAX_LINE >> 10} KB were read by their "
                           f"first and last {half} KB only (first at line {self.counts.first_cut_line})")
        reasons.extend(f"not read: {why}" for why in self.unread)
        reasons.extend(f"the live guard stopped analysing {why}; the steps after it were not checked"
                       for why in self.guard_off)
        return reasons

    def noting_guard_off(self, records: Iterable[Record]) -> Iterator[Record]:
        """The records, unchanged; a live guard's "internal-error" event (its analysis switched off on
        every rank, training went on) is noted as a reason the analysis is incomplete. Its "recovery" events
        (every rank wrote each) are kept once per step for the report and held back from the detectors."""
        for record in records:
            if record.kind == EVENT and record.event == "recovery":
                if all(known["step"] != record.step for known in self.recoveries):
                    self.recoveries.append(record.data)
                continue
            if record.kind == EVENT and record.event == "internal-error" and not self.guard_off:  # every rank wrote it
                detail = record.data.get("detail") or "an internal error"
                self.guard_off.append(f"at step {record.step} on rank {record.rank} ({detail})")
            yield record

    def spool_dir(self) -> Path:
        if self._spool is None:
            import tempfile  # only a pipe or stdin is spooled: a file's analysis does not load it

            self._spool = tempfile.TemporaryDirectory(prefix="lossguard-")
        return Path(self._spool.name)

    def close(self) -> None:
        if self._spool is not None:
            self._spool.cleanup()
            self._spool = None


def discover_inputs(paths: list[str], gathering: Gathering | None = None) -> list[Input]:
    gathering = gathering if gathering is not None else Gathering()
    found: list[Input] = []
    for text in paths:
        name, run = trackers.split_selector(text)  # `mlflow.db#RUN`: one run of an MLflow SQLite store
        path = Path(name)
        if text != "-" and not path.exists():
            raise SourceError(f"{text}: no such file or directory")
        if text != "-" and path.is_dir():
            found.extend(_walk(path, gathering))
            continue
        label = "<stdin>" if text == "-" else text
        spooled = text == "-" or not _is_regular(path)
        if spooled:
            path = _spool(text, gathering)
        source = sniff(path)
        if source is None and spooled and path.stat().st_size == 0:
            source = TextLogSource()  # an empty pipe: "no training metrics seen", like an empty run
        if source is None:
            raise SourceError(f"{label}: empty or not a training log (binary data or an unknown format); "
                              "pass the run's stdout log, trainer_state.json, a TensorBoard event file or "
                              "the output directory")
        source = trackers.bind(path, source, run, gathering, label)
        found.append(Input(path, source, label))
        gathering.used.append(f"{label} ({source.name})")
    if found and not any(isinstance(i.source, LossguardEventsSource) for i in found) and \
            not any(p != "-" and Path(p).is_dir() for p in paths):
        beside.read_recoveries([Path(p) for p in paths if p != "-" and _is_regular(Path(p))], gathering)
    return found


def _is_regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(path.stat().st_mode)
    except OSError:
        return False


def _spool(text: str, gathering: Gathering) -> Path:
    """Copy stdin or a pipe to a temporary file in one pass: it can be read only once."""
    name = "stdin" if text == "-" or Path(text).name.isdigit() else Path(text).name
    target = gathering.spool_dir() / f"{len(gathering.used)}-{name}"
    import shutil

    try:
        with open(target, "wb") as out:
            if text == "-":
                shutil.copyfileobj(sys.stdin.buffer, out, 1 << 20)
            else:
                with open(text, "rb") as source:
                    shutil.copyfileobj(source, out, 1 << 20)
    except OSError as exc:
        raise SourceError(f"{text}: cannot read ({exc.strerror or exc})") from None
    return target


def _walk(root: Path, gathering: Gathering) -> list[Input]:
    tracked = trackers.runs_in(root, gathering)  # MLflow / W&B runs: their files are read by their readers
    files = [p for p in sorted(root.rglob("*")) if p.is_file() and not tracked.owns(p)]
    # In an output dir with checkpoint-* folders, the top-level trainer_state.json (or else the latest
    # checkpoint's) holds the whole history; older checkpoints hold prefixes of it.
    states = [p for p in files if p.name == "trainer_state.json"]
    keep = _best_state(root, states) if len(states) > 1 else None
    inputs = []
    for path in files:
        why = _skip_reason(path, keep)
        source = sniff(path) if why is None else None
        if why is None and source is None:
            why = "not a training log"
        if why is not None:
            if why != "model file":  # weights, tokenizers and configs are not worth a line each
                gathering.skipped.append(f"{path}: {why}")
            continue
        try:
            source = trackers.bind(path, source, None, gathering, str(path))
        except SourceError as exc:  # a damaged mlflow.db beside the run's other logs: those are still read
            gathering.unread.append(str(exc))
            continue
        inputs.append(Input(path, source))
        gathering.used.append(f"{path} ({source.name})")
    inputs = tracked.inputs + inputs
    if not inputs and tracked.empty_store:
        raise SourceError(tracked.empty_store)
    if not inputs:
        raise SourceError(f"{root}: no training log found in this directory (looked for *.log / *.txt stdout "
                          "logs, trainer_state.json, TensorBoard events, *.jsonl, *.csv); pass the log file itself")
    return inputs


def _skip_reason(path: Path, keep_state: Path | None) -> str | None:
    if path.name in SKIP_NAMES or path.suffix.lower() in SKIP_SUFFIXES:
        return "model file"
    if any(part.startswith("global_step") for part in path.parts):
        return "model file"
    if keep_state is not None and path.name == "trainer_state.json" and path != keep_state:
        return f"an older checkpoint's copy of {keep_state}"
    return None


def _best_state(root: Path, states: list[Path]) -> Path:
    top = root / "trainer_state.json"
    if top in states:
        return top

    def checkpoint_number(path: Path) -> int:
        match = CHECKPOINT.search(path.parent.name)
        return int(match.group(1)) if match else -1

    return max(states, key=checkpoint_number)


def _parse(item: Input, gathering: Gathering | None) -> Iterator[Record]:
    counts = gathering.counts if gathering is not None else None
    if isinstance(item.source, TextLogSource):  # the guard's recovered lines in it go to the report's list
        return parse_file(item.path, counts, gathering.recoveries if gathering is not None else None)
    if isinstance(item.source, JsonLinesSource):
        return item.source.parse(item.path, counts)
    if isinstance(item.source, LossguardEventsSource):
        return _noting_guard_off(item.source.parse(item.path), gathering)
    return item.source.parse(item.path)


def _noting_guard_off(records: Iterator[Record], gathering: Gathering | None) -> Iterator[Record]:
    """Only the live guard's own event files can say it stopped analysing: other sources' records reach the
    engine without a generator in between (it would cost per record on a big log)."""
    return records if gathering is None else gathering.noting_guard_off(records)


def merged_records(inputs: list[Input], gathering: Gathering | None = None) -> Iterator[Record]:
    if len(inputs) == 1 and gathering is not None and gathering.recoveries:  # read from the events dir beside
        return _without_recovered(_parse(inputs[0], gathering), gathering)
    if len(inputs) == 1:  # the common case, streamed (a log of millions of lines stays flat in memory) and
        return _parse(inputs[0], gathering)  # handed on as it is: a generator in between costs per record
    return _merged_many(inputs, gathering)


def _merged_many(inputs: list[Input], gathering: Gathering | None) -> Iterator[Record]:
    live = [i.path for i in inputs if isinstance(i.source, LossguardEventsSource)]
    if len(live) > 1:  # one file per rank: interleave by step so cross-rank detectors see a step together
        from lossguard.sources.lossguard_events import merged

        yield from _noting_guard_off(merged(live), gathering)
        inputs = [i for i in inputs if not isinstance(i.source, LossguardEventsSource)]
    if len(inputs) == 1:  # the live files and one other input
        yield from _without_recovered(_parse(inputs[0], gathering), gathering)
        return
    rank = {type(s): i for i, s in enumerate(SOURCES)}  # by type: a tracker's source is bound to its run
    ordered = sorted(inputs, key=lambda i: rank.get(type(i.source), len(SOURCES)))
    yield from _without_recovered(_merge_on_steps(_read_each(ordered, gathering)), gathering)


def _without_recovered(records: Iterable[Record], gathering: Gathering | None) -> Iterator[Record]:
    """The records, less the training records of the steps the live guard recovered (read from its events,
    which come first). What a log says of such a step is its faulty first attempt, never applied: the
    Trainer's NaN filter even logs a made-up loss there, which would read as a drop and a divergence."""
    recovered: set = set()
    shift = None
    if gathering is not None and gathering.events_losses:
        records = beside.tied(records, gathering)  # may drop another run's recoveries before its first record
    for record in records:
        if shift is None and record.kind == TRAIN and record.step is not None:
            shift = beside.shift(record.step, gathering)
            steps = {r.get("step") for r in gathering.recoveries} if gathering is not None else set()
            recovered = {step - shift for step in steps if step is not None}
        if recovered and record.kind != EVENT and record.step in recovered:
            continue
        yield record


def _read_each(inputs: list[Input], gathering: Gathering | None) -> list[list[Record]]:
    """Every input's records; one that cannot be read is left out and said so (the analysis is then
    incomplete), unless none can be read: then the first refusal stands."""
    streams, refusals = [], []
    for item in inputs:
        try:
            streams.append(list(_parse(item, gathering)))
        except SourceError as exc:
            refusals.append(exc)
            if gathering is not None:
                gathering.unread.append(str(exc))
                gathering.used.remove(f"{item.label} ({item.source.name})")
    if refusals and not streams:
        raise refusals[0]
    return streams


def _merge_on_steps(streams: list[list[Record]]) -> Iterator[Record]:
    """Several sources' records (most precise first) as one stream in step order, one record per step."""
    by_step: dict[tuple, Record] = {}
    out: list[Record] = []
    for records in streams:
        steps = sorted({r.step for r in records if r.kind != EVENT and not r.step_is_ordinal and r.step is not None})
        known = sorted({key[1] for key in by_step if key[0] != EVENT})
        position = -1
        for record in records:
            if record.kind == EVENT:
                out.append(record)
                continue
            position += record.kind == TRAIN
            if record.step_is_ordinal and known and not steps and record.kind == TRAIN:
                record.step = _aligned(known, position)
                record.step_is_ordinal = False
            key = (record.kind, record.step, record.rank)
            precise = by_step.get(key)  # inputs come most precise first: this step's record from the best source
            if precise is None:
                by_step[key] = record
                out.append(record)
            else:
                _keep_failure(precise, record)
    out.sort(key=lambda r: -1 if r.step is None else r.step)
    yield from out


def _aligned(known: list[int], position: int) -> int:
    """The step of the `position`-th log of a log that names no steps, from another source's steps."""
    if position < len(known):
        return known[position]
    interval = known[-1] - known[-2] if len(known) > 1 else 1
    return known[-1] + interval * (position - len(known) + 1)


def _keep_failure(precise: Record, other: Record) -> None:
    """Join `other` (a less precise source's record of the same step) into `precise`: its new signals, and
    every value it shows non-finite where `precise` shows a finite one."""
    for name, value in other.signals.items():
        current = precise.signals.get(name)
        if current is None or (math.isfinite(current) and not math.isfinite(value)):
            precise.signals[name] = value
