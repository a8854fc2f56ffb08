"""Plain-text training logs: HF Trainer stdout, DeepSpeed lines, Megatron, mmengine, warnings, anything else.

The path of one line: `scan.py` finds the lines that hold an anchor (`patterns.ANCHOR_STRINGS`, with grep
where it exists), so a log of millions of tqdm / INFO lines costs little more than the scan. Each such line
goes to the readers (`sources/readers/`, pure functions: bytes in, `Fields` out), first one that knows it wins;
`placer.StepPlacer` gives the fields a step, with the context of the lines before; `merge.merged` joins the
records of one step. Mixed formats in one file are fine: every line is classified on its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from lossguard.core.records import TRAIN, Record
from lossguard.sources.merge import merged
from lossguard.sources.placer import StepPlacer
from lossguard.sources.readers import (
    darknet,
    deepspeed_step,
    ds_facts,
    events,
    generic,
    guard_lines,
    keras,
    log_dict,
    megatron,
    mmengine,
    plain_step,
    timm,
    training_args,
)
from lossguard.sources.readers.fields import Fields, Form
from lossguard.sources.scan import ScanCounts, iter_grep_lines, iter_lines, uncoloured

# The numeric line formats tried after log dicts, DeepSpeed `step=` lines and events, in this order: (a literal
# the line must contain, the reader). A new format is a reader module and a row here.
LINE_READERS: tuple[tuple[bytes, Callable[[bytes], Fields | list[Fields] | None]], ...] = (
    (b"iteration ", megatron.read),
    (b"Epoch ", keras.read),  # Keras's epoch header: no step of its own, it numbers the bars below
    (b" - ", keras.read),
    (b" rate, ", darknet.read),
    (b"Region ", darknet.read),  # a YOLO layer's line: read as nothing, never as a loss
    (b"(train)", mmengine.read),
    (b"(val)", mmengine.read),
    (b"Epoch [", mmengine.read),  # mmcv's
    (b"Iter [", mmengine.read),
    (b"Loss: ", timm.read),
    (b"step ", plain_step.read),
    (b"iter ", plain_step.read),
    (b"16=", training_args.read),  # the TrainingArguments dump: bf16= / fp16= / gradient_checkpointing=
    (b"checkpointing=", training_args.read),
    (b" ", ds_facts.read),
)


_read_dict, _DICT_COPY = log_dict.read, log_dict.COPY  # module globals: one lookup less per line


class TextLogParser:
    """One log's lines -> records: the readers, then the log's `StepPlacer`."""

    def __init__(self, source: str = "", recoveries: list[dict] | None = None) -> None:
        self.source = source
        self.placer = StepPlacer(source)
        # The steps the live guard said it recovered (`lossguard: recovered at step N: ...`): the log's training
        # record of such a step is its faulty first attempt, never applied; `merge.merged` and `watch` leave it
        # out. Each recovery is added to `recoveries` (the report's), once per step.
        self.recovered: set[int] = set()
        self.recoveries = recoveries if recoveries is not None else []

    @property
    def last_step(self) -> int | None:
        return self.placer.last_step

    @last_step.setter
    def last_step(self, step: int | None) -> None:  # a JSON-lines row placed a step (structured.py)
        self.placer.last_step = step

    def parse_line(self, line: bytes, line_no: int | None = None) -> list[Record]:
        placer = self.placer
        # Log dicts first: most metric lines of an HF log are one. Another node's copy is read as nothing.
        if b"{" in line and (fields := _read_dict(line, placer.recent_dicts)) is not None:
            return [] if fields is _DICT_COPY else [placer.log_dict(fields, line_no)]
        if b"skipped=" in line and (fields := deepspeed_step.read(line)) is not None:
            return [placer.ds_step(fields, line_no)]  # DeepSpeed's progress line, as common as the dicts
        if b"lossguard: " in line and (fields := guard_lines.read(line)) is not None:
            if fields.event == "recovery":
                return self._recovered(fields.data)
            return [placer.event(fields, line_no)]  # the live guard's own report of this run
        if (fields := events.read(line)) is not None:
            # A tqdm bar left open by `\r` and a logger's event printed after it share a line: the bar's
            # postfix (`loss=nan, lr=2.5e-05`) is read too, after the event, which is placed on the bar's step
            # (an OVERFLOW there means that step's loss belongs to a skipped step).
            event = placer.event(fields, line_no)
            return [event, *(self.parse_line(fields.before, line_no) if fields.bar is not None else [])]
        for needle, read in LINE_READERS:
            if needle in line and (found := read(line)) is not None:  # []: its line, nothing to read
                if isinstance(found, list):
                    if found and found[0].form == Form.KERAS:
                        return placer.keras(found, line_no)
                    return placer.numbered(found, line_no)
                if found.form == Form.FACTS:  # the DeepSpeed banner and config dump
                    return [placer.event(found, line_no)]
                return placer.numbered([found], line_no)
        if placer.open is not None and (rest := placer.goes_on(line, line_no)) is not None:
            return [rest]
        return placer.segments(generic.read(line), line_no)

    def _recovered(self, recovery: dict) -> list[Record]:
        """A step the guard recovered: noted, no record (the report lists it, no detector reads it)."""
        step = recovery["step"]
        self.recovered.add(step)
        if all(known.get("step") != step for known in self.recoveries):
            self.recoveries.append(recovery)
        return []

    def kept(self, record: Record) -> bool:
        """False for the training record of a step the guard recovered."""
        return not (record.kind == TRAIN and record.step in self.recovered)


def parse_stream(stream: BinaryIO, source: str, counts: ScanCounts | None = None) -> Iterator[Record]:
    """A stream read once, in Python (pipes and in-memory streams; files go through `parse_file`)."""
    yield from merged(TextLogParser(source), iter_lines(stream, counts))


def parse_file(path: Path, counts: ScanCounts | None = None, recoveries: list[dict] | None = None) -> Iterator[Record]:
    """`recoveries`: where the steps the live guard says it recovered go (the report's `recoveries`)."""
    lines = iter_grep_lines(path, counts)
    if lines is None:
        return _parse_opened(path, counts, recoveries)
    return merged(TextLogParser(path.name, recoveries), lines)  # no generator in between: it would cost per record


def _parse_opened(path: Path, counts: ScanCounts | None, recoveries: list[dict] | None) -> Iterator[Record]:
    with open(path, "rb") as stream:
        yield from merged(TextLogParser(path.name, recoveries), iter_lines(stream, counts))


def parse_lines(lines: Iterable[bytes], source: str = "") -> Iterator[Record]:
    """For callers that already have lines (tests, tools): same parser, no chunking."""
    yield from merged(TextLogParser(source), ((n, uncoloured(line)) for n, line in enumerate(lines, 1)))


# Control bytes no log writes (tab, newline, CR, form feed, ESC of colours are fine).
_CONTROL = bytes(b for b in range(32) if b not in (9, 10, 11, 12, 13, 27))


def looks_binary(sample: bytes) -> bool:
    """Weights, archives, images: mostly NUL or many control bytes. A log with a run of NUL bytes (the
    padding a crashed node leaves in a file being written) is still a log."""
    text = sample.replace(b"\x00", b"")
    if len(text) * 2 < len(sample):
        return True
    controls = len(text) - len(text.translate(None, _CONTROL))
    return controls * 20 > len(text)


class TextLogSource:
    name = "text"

    def sniff(self, path: Path, head: bytes) -> bool:
        return not looks_binary(head[:4096])

    def parse(self, path: Path) -> Iterator[Record]:
        return parse_file(path)
