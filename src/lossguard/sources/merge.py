"""One record per step: the records a text log gives for one step, merged.

A DeepSpeed `step=` line and the log dict of that step, a progress bar and the dict printed with it, the
metric lines of one step block: fewer, richer records, so the detectors see each step once. A log dict whose
step had to be estimated takes the step of a `step=` line next to it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from lossguard.core.records import EVENT, TRAIN, Record
from lossguard.sources.readers import deepspeed_step

if TYPE_CHECKING:
    from lossguard.sources.text_log import TextLogParser


def merged(parser: TextLogParser, lines: Iterable[tuple[int, bytes]]) -> Iterator[Record]:
    """The parser's records over `lines`, with the records of one step merged into one."""
    placer = parser.placer
    parse, read_step_line = parser.parse_line, deepspeed_step.read
    pending: Record | None = None  # the last step's record, still open to the lines of its step
    pending_guessed = False  # its step was estimated
    recovered = parser.recovered  # filled as the guard's recovered lines are read
    for line_no, line in lines:
        # DeepSpeed's `step=` line right after a log dict whose step was estimated (half the lines of a big HF +
        # DeepSpeed log): the dispatch would hand it to this same reader and placer, and its record to `_merge`.
        # Its record would join `pending` in `_merge` (a train record of no rank, at an estimated step, takes
        # the step= line's step): `_absorb` does that join without building the record.
        if pending_guessed and pending.kind == TRAIN and pending.rank is None and pending is not placer.provisional \
                and (fields := read_step_line(line)) is not None and b"{" not in line:
            pending.step = placer.note_ds_step(fields.step)
            _absorb(pending, fields.signals, False)
            pending_guessed = False
            continue
        for record in parse(line, line_no):
            guessed = record is placer.guessed
            if pending is not None and pending is placer.provisional:
                placer.provisional = None
                if record.step == pending.step and record.kind == pending.kind and record.rank == pending.rank:
                    pending.signals.update(record.signals)  # the step's own values replace the estimate
                    continue
            if pending is not None:
                if _merge(pending, pending_guessed, record, guessed):
                    pending_guessed = pending_guessed and guessed
                    continue
                if not recovered or parser.kept(pending):  # the guard's recovered step: its attempt left out
                    yield pending
            if record.kind == EVENT:
                yield record
                pending, pending_guessed = None, False
                continue
            pending, pending_guessed = record, guessed
    if pending is not None and parser.kept(pending):
        yield pending


def _merge(pending: Record, pending_guessed: bool, new: Record, new_guessed: bool) -> bool:
    """Merge `new` into `pending` (the record before it) when both are one step's numbers; True if merged."""
    if new.kind != pending.kind or new.rank != pending.rank or new.kind == EVENT:
        return False
    if new.step == pending.step:
        pass
    elif pending_guessed and _is_ds_step(new):
        pending.step = new.step
    elif new_guessed and _is_ds_step(pending):
        pass
    else:
        return False
    _absorb(pending, new.signals, new.step_is_ordinal and pending.step == new.step)
    return True


def _absorb(pending: Record, signals: dict[str, float], still_ordinal: bool) -> None:
    """`pending` takes the values it lacks from a record of its step (its own values stand)."""
    own = pending.signals
    for name, value in signals.items():
        if name not in own:
            own[name] = value
    pending.step_is_ordinal = pending.step_is_ordinal and still_ordinal


def _is_ds_step(record: Record) -> bool:
    return "skipped_steps" in record.signals and "loss" not in record.signals
