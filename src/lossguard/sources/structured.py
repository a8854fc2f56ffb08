"""Structured logs: trainer_state.json, JSON lines (LLaMA-Factory, ms-swift, generic) and CSV.

All of them are rows of `{key: value}` with a step column; `rows_to_records` maps keys through the
signal catalog so every format ends in the same records.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from lossguard.core.records import EVAL, EVENT, TRAIN, Record
from lossguard.core.signals import STEP_KEYS, canonical, to_float
from lossguard.sources.base import SourceError


def rows_to_records(rows: Iterable[tuple[int, dict]], source: str) -> Iterator[Record]:
    ordinal = 0
    last_step: int | None = None
    for line_no, row in rows:
        if not isinstance(row, dict):
            continue
        step = _step_of(row)
        ordinal += 1
        if step is None and last_step is not None:
            step = last_step  # a row without a step (predict metrics) in a log that has them: the last step
        last_step = step
        if "train_runtime" in row:
            yield Record(step=step, kind=EVENT, event="train-summary", source=source, line_no=line_no,
                         data={k: v for k, v in row.items() if isinstance(v, (int, float))})
            continue
        signals = {}
        for key, value in row.items():
            name = canonical(str(key))
            number = to_float(value)
            if name is not None and number is not None:
                signals[name] = number
        if not signals.keys() - {"epoch"}:
            continue
        # An eval key counts only with a value: LLaMA-Factory's trainer_log.jsonl carries "eval_loss": null
        # on every training row.
        is_eval = any(str(k).startswith(("eval_", "eval/")) and to_float(v) is not None for k, v in row.items())
        yield Record(step=ordinal if step is None else step, signals=signals,
                     kind=EVAL if is_eval else TRAIN, source=source, line_no=line_no,
                     step_is_ordinal=last_step is None)


def _step_of(row: dict) -> int | None:
    for key in STEP_KEYS:
        value = to_float(row.get(key))
        if value is not None:
            return int(value)
    value = row.get("global_step/max_steps")  # ms-swift
    if isinstance(value, str) and value.split("/")[0].isdigit():
        return int(value.split("/")[0])
    return None


class TrainerStateSource:
    """transformers' trainer_state.json (`log_history`; NaN written as a bare `NaN` literal), under any
    file name (users paste it as log.txt), and also when it was cut mid-file: the complete entries count."""

    name = "trainer_state"

    def sniff(self, path: Path, head: bytes) -> bool:
        return b'"log_history"' in head and head.lstrip()[:1] == b"{"

    def parse(self, path: Path) -> Iterator[Record]:
        text = path.read_text(encoding="utf-8", errors="replace")
        try:
            state = json.loads(text)
        except json.JSONDecodeError as exc:
            history = _complete_entries(text)
            if not history:
                raise SourceError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}) "
                                  "and no complete `log_history` entry; point lossguard at a complete "
                                  "trainer_state.json or at the run's stdout log") from None
        else:
            history = state.get("log_history") if isinstance(state, dict) else None
        if not isinstance(history, list):
            raise SourceError(f"{path}: no `log_history` list in this trainer_state.json")
        yield from rows_to_records(((None, row) for row in history), path.name)


def _complete_entries(text: str) -> list[dict]:
    """The `log_history` entries of a trainer_state.json cut mid-file, up to the last complete one."""
    start = text.find('"log_history"')
    start = text.find("[", start) + 1 if start >= 0 else 0
    decoder = json.JSONDecoder()
    entries: list[dict] = []
    while start:
        brace = text.find("{", start)
        if brace < 0:
            break
        try:
            entry, start = decoder.raw_decode(text, brace)
        except ValueError:
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
            row = json.loads(first)
        except ValueError:
            return False
        return isinstance(row, dict) and (_step_of(row) is not None or "loss" in row) and "lossguard" not in row

    def parse(self, path: Path) -> Iterator[Record]:
        yield from rows_to_records(_json_rows(path), path.name)


def _json_rows(path: Path) -> Iterator[tuple[int, dict]]:
    with open(path, encoding="utf-8", errors="replace") as handle:
        for line_no, line in enumerate(handle, 1):
            line = line.strip()
            if not line:
                continue
            try:
                yield line_no, json.loads(line)
            except ValueError:
                continue  # a torn last line of a live run is expected; skip, never fail the whole file


class CsvSource:
    """A CSV with a header row that names a step column and at least one known signal."""

    name = "csv"

    def sniff(self, path: Path, head: bytes) -> bool:
        if path.suffix not in (".csv", ".tsv"):
            return False
        header = head.split(b"\n", 1)[0].decode("utf-8", "replace").lower()
        cols = [c.strip() for c in header.replace("\t", ",").split(",")]
        return any(c in STEP_KEYS for c in cols) and any(canonical(c) for c in cols)

    def parse(self, path: Path) -> Iterator[Record]:
        delimiter = "\t" if path.suffix == ".tsv" else ","
        with open(path, newline="", encoding="utf-8", errors="replace") as handle:
            reader = csv.DictReader(handle, delimiter=delimiter)
            yield from rows_to_records(((i + 2, row) for i, row in enumerate(reader)), path.name)
