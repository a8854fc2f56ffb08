"""One record per step: the records a text log gives for one step, merged.

A DeepSpeed `step=` line and the log dict of that step, a progress bar and the dict printed with it, the
metric lines of one step block: fewer, richer records, so the detectors see each step once. A log dict whose
step had to be estimated takes the step of a `step=` line next to it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from lossguard.core.records import EVENT, Record

if TYPE_CHECKING:
    from lossguard.sources.text_log import TextLogParser


def merged(parser: TextLogParser, lines: Iterable[tuple[int, bytes]]) -> Iterator[Record]:
    """The parser's records over `lines`, with the records of one step merged into one."""
    placer = parser.placer
    parse = parser.parse_line
    pending: Record | None = None  # the last step's record, still open to the lines of its step
    pending_guessed = False  # its step was estimated
    for line_no, line in lines:
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
                yield pending
            if record.kind == EVENT:
                yield record
                pending, pending_guessed = None, False
                continue
            pending, pending_guessed = record, guessed
    if pending is not None:
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
    signals = pending.signals
    for name, value in new.signals.items():
        if name not in signals:
            signals[name] = value
    pending.step_is_ordinal = pending.step_is_ordinal and new.step_is_ordinal and pending.step == new.step
    return True


def _is_ds_step(record: Record) -> bool:
    return "skipped_steps" in record.signals and "loss" not in record.signals
