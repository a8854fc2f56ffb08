"""Structured logs: trainer_state.json, JSON lines (LLaMA-Factory, ms-swift, generic) and CSV.

All of them are rows of `{key: value}` with a step column; `rows_to_records` maps keys through the
signal catalog so every format ends in the same records.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from lossguard.core.records import EVAL, EVENT, TRAIN, Record
from lossguard.core.signals import to_float
from lossguard.sources import patterns as P
from lossguard.sources.base import JSON, JSON_ERRORS, SourceError
from lossguard.sources.paste import unwrap
from lossguard.sources.scan import ScanCounts, bounded_lines
from lossguard.sources.vocabulary import is_step, meaning, put_loss, row_step


def rows_to_records(rows: Iterable[tuple[int | None, dict]], source: str) -> Iterator[Record]:
    reader = RowReader(source)
    for line_no, row in rows:
        record = reader.record(line_no, row)
        if record is not None:
            yield record


class RowReader:
    """`{key: value}` rows -> records, one row at a time (a JSONL file may mix rows with text lines)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.ordinal = 0
        self.last_step: int | None = None

    def record(self, line_no: int | None, row: object) -> Record | None:
        if not isinstance(row, dict):
            return None
        step = row_step(row)
        self.ordinal += 1
        if step is None and self.last_step is not None:
            step = self.last_step  # a row without a step (predict metrics) in a log that has them: the last step
        self.last_step = step
        keys = [(meaning(str(key)), value) for key, value in row.items()]
        if any(key.summary for key, _ in keys):
            return Record(step=step, kind=EVENT, event="train-summary", source=self.source, line_no=line_no,
                          data={k: v for k, v in row.items() if isinstance(v, (int, float))})
        signals: dict[str, float] = {}
        is_eval = False
        for key, value in keys:
            number = to_float(value)
            if number is None:
                continue
            # An eval key counts only with a value: LLaMA-Factory's trainer_log.jsonl carries "eval_loss": null
            # on every training row.
            is_eval = is_eval or key.evaluation
            if key.catalog == "loss":
                put_loss(signals, number)  # a second loss column: its NaN is kept (vocabulary.put_loss)
            elif key.catalog is not None:
                signals[key.catalog] = number
        if not signals.keys() - {"epoch"}:
            return None
        return Record(step=self.ordinal if step is None else step, signals=signals,
                      kind=EVAL if is_eval else TRAIN, source=self.source, line_no=line_no,
                      step_is_ordinal=self.last_step is None)


class TrainerStateSource:
    """transformers' trainer_state.json (`log_history`; NaN written as a bare `NaN` literal), under any
    file name (users paste it as log.txt), and also when it was cut mid-file: the complete entries count."""

    name = "trainer_state"

    def sniff(self, path: Path, head: bytes) -> bool:
        if b'"log_history"' in head and head.lstrip()[:1] == b"{":
            return True
        # quoted or folded in an issue: its markers come off first
        return _pasted_json(unwrap(head.decode("utf-8", "replace")).encode()) is not None

    def parse(self, path: Path) -> Iterator[Record]:
        text = unwrap(path.read_text(encoding="utf-8", errors="replace"))
        try:
            state = JSON.decode(text)
        except JSON_ERRORS as exc:
            history = _complete_entries(text)
            if not history:
                where = f"line {exc.lineno}, column {exc.colno}: {exc.msg}" if hasattr(exc, "lineno") else \
                    "nested too deep"
                raise SourceError(f"{path}: not valid JSON ({where}) and no complete `log_history` entry; "
                                  "point lossguard at a complete trainer_state.json or at the run's stdout "
                                  "log") from None
        else:
            history = state.get("log_history", [state] if row_step(state) is not None else None) \
                if isinstance(state, dict) else state
        if not isinstance(history, list):
            raise SourceError(f"{path}: no `log_history` list in this trainer_state.json")
        yield from rows_to_records(((None, row) for row in history), path.name)


# What a pasted `log_history` starts with (after blank lines and a markdown fence): the key itself, or a JSON
# list or object whose `{` is alone on its line (written with indent=2, one key per line).
_HISTORY_START = re.compile(rb'\s*(?:```\w*\s*\n\s*)?(?:"log_history"\s*:|\[\s*\n|\[?\s*\{\s*\n)')


def _pasted_json(head: bytes) -> re.Match | None:
    """trainer_state.json, or its `log_history` pasted as a JSON list, pretty-printed or cut (the lines of one
    entry, `"loss": 2.3,` then `"step": 10`, mean something only together)."""
    match = _HISTORY_START.match(head)
    if match is None:
        return None
    first_entry = head[: head.find(b"}", match.end())]  # (the whole head if no entry closes in it)
    return match if b'"log_history"' in head or b'"step":' in first_entry else None


def _complete_entries(text: str) -> list[dict]:
    """The `log_history` entries of a trainer_state.json cut mid-file, up to the last complete one."""
    start = text.find('"log_history"')
    start = text.find("[", start) + 1 if start >= 0 else 0
    entries: list[dict] = []
    while start:
        brace = text.find("{", start)
        if brace < 0:
            break
        try:
            entry, start = JSON.raw_decode(text, brace)
        except JSON_ERRORS:
            break
        if isinstance(entry, dict):
            entries.append(entry)
    return entries


class JsonLinesSource:
    """One JSON object per line with a step column: LLaMA-Factory trainer_log.jsonl, ms-swift logging.jsonl."""

    name = "jsonl"

    def sniff(self, path: Path, head: bytes) -> bool:
        first = head.lstrip().split(b"\n", 1)[0]
        if not (first.startswith(b"{") and path.suffix in (".jsonl", ".json", ".ndjson", ".log", ".txt")):
            return False
        try:
            row = JSON.decode(first.decode("utf-8", "replace"))
        except JSON_ERRORS:
            return False
        return isinstance(row, dict) and (row_step(row) is not None or "loss" in row) and "lossguard" not in row

    def parse(self, path: Path, counts: ScanCounts | None = None) -> Iterator[Record]:
        """Each line on its own: a JSON object is a row, any other line goes to the text-log parser (a stdout
        log whose first line happens to be a JSON record is still read whole)."""
        from lossguard.sources.text_log import TextLogParser

        rows, text = RowReader(path.name), TextLogParser(path.name)
        with open(path, "rb") as handle:
            for line_no, line in bounded_lines(handle, counts):
                row = _json_row(line)
                if row is not None:
                    if (record := rows.record(line_no, row)) is not None:
                        text.last_step = record.step if record.kind == TRAIN else text.last_step
                        yield record
                elif P.ANCHORS.search(line):
                    yield from text.parse_line(line.rstrip(b"\r\n"), line_no)


def _json_row(line: bytes) -> dict | None:
    line = line.strip()
    if not line.startswith(b"{"):
        return None
    try:
        row = JSON.decode(line.decode("utf-8", "replace"))
    except JSON_ERRORS:
        return None  # a torn last line of a live run, or a text line: never fail the whole file
    return row if isinstance(row, dict) else None


# TensorBoard's "download CSV" of one scalar: `Wall time,Step,Value`, the tag in the file name
# (`run-<run>-tag-<tag>.csv`, its `/` written `_`): the Value column is that tag.
_TB_EXPORT = re.compile(r"-tag-(.+)\.csv$")


def _tag_signal(path: Path) -> str | None:
    """The signal a TensorBoard CSV export's Value column holds, from its file name (`train_loss`,
    `train_grad_norm` for the tag train/grad_norm)."""
    match = _TB_EXPORT.search(path.name)
    if match is None:
        return None
    tag = match.group(1)
    return meaning(tag).catalog or meaning(tag.replace("_", "/", 1)).catalog


class CsvSource:
    """A CSV with a header row that names a step column and at least one known signal (or a TensorBoard
    export whose file name names the signal of its Value column)."""

    name = "csv"

    def sniff(self, path: Path, head: bytes) -> bool:
        if path.suffix not in (".csv", ".tsv"):
            return False
        header = head.split(b"\n", 1)[0].decode("utf-8", "replace").lower()
        cols = [c.strip() for c in header.replace("\t", ",").split(",")]
        named = any(meaning(c).catalog for c in cols) or "value" in cols and _tag_signal(path) is not None
        return any(is_step(c) for c in cols) and named

    def parse(self, path: Path) -> Iterator[Record]:
        import csv  # only a CSV input needs it: every other analysis starts faster without

        delimiter = "\t" if path.suffix == ".tsv" else ","
        signal = _tag_signal(path)
        with open(path, newline="", encoding="utf-8", errors="replace") as handle:
            reader = csv.DictReader(handle, delimiter=delimiter)
            if signal is not None and reader.fieldnames and "Value" in reader.fieldnames:
                reader.fieldnames = [signal if f == "Value" else f for f in reader.fieldnames]
            yield from rows_to_records(((i + 2, row) for i, row in enumerate(reader)), path.name)
