"""A table of steps and values pasted as text: a header row of names, then rows of numbers.

    | step | loss  | lr      |          step  loss   lr
    |------|-------|---------|          10    2.412  1e-05
    | 10   | 2.412 | 1e-05   |          20    2.301  1e-05

The names are in the header only, so no value row holds a loss-like word: the text-log path (which reads
lines that name a metric) would see nothing. This source takes a file whose first line naming a loss is
such a header followed by a row of numbers; each value row becomes a `{name: value}` row, read as a JSONL
or CSV row is (`RowReader`), its columns named as the generic reader names them (`Training Loss` is the
loss, `Validation Loss` the eval loss). Cells are split as the header's are: on `|` when it has one, else on
tabs, else on commas, else on whitespace (where a cell of no letter or digit, mlx-lm's trend arrow, is
decoration, and `1,234` one number). Columns not read may hold measurements (`4.4k`, `3.12s`). A table of
epochs with no step column (Chainer's PrintReport: `epoch  main/loss  validation/main/loss  elapsed_time`) is
on its epochs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from lossguard.core.records import Record
from lossguard.core.signals import to_float
from lossguard.sources.structured import RowReader
from lossguard.sources.vocabulary import column_name, put_loss

_RULE_CHARS = frozenset("|-: \t\r\n")
_MAX_CELLS = 64


def _is_rule(line: str) -> bool:
    """A markdown separator row (|------|:---:|)."""
    return "-" in line and set(line) <= _RULE_CHARS


def _separator(header: str) -> str | None:
    """How the header's cells are split, and so every row's: `|`, a tab, a comma, or whitespace (None)."""
    return next((sep for sep in ("|", "\t", ",") if sep in header), None)


def _cells(line: str, sep: str | None) -> list[str]:
    if sep == "|":
        inner = line.strip()
        inner = inner[1:] if inner.startswith("|") else inner
        inner = inner[:-1] if inner.endswith("|") else inner
        return [cell.strip() for cell in inner.split("|")]
    if sep is not None:
        return [cell.strip() for cell in line.strip().split(sep)]
    # Whitespace-aligned columns: a cell of no letter or digit is decoration (mlx-lm's `1.542 ▼` trend arrow).
    return [cell for cell in line.split() if any(ch.isalnum() for ch in cell)]


def _header(line: str) -> list[str] | None:
    """The column names, when `line` is a header naming a loss (no cell a number)."""
    cells = _cells(line, _separator(line))
    if not 2 <= len(cells) <= _MAX_CELLS or any(to_float(c) is not None or not c for c in cells):
        return None
    names = [column_name(c) for c in cells]
    return names if "loss" in names or "eval_loss" in names else None


def _number(cell: str, sep: str | None) -> float | None:
    """A cell's number; in whitespace-aligned columns `1,234` is one thousand two hundred and thirty-four."""
    value = to_float(cell)
    if value is None and sep is None and "," in cell:
        value = to_float(cell.replace(",", ""))
    return value


def _values(line: str, sep: str | None, names: list[str | None]) -> list[float | None] | None:
    """A row of one cell per column: the columns read (step, loss, ...) hold numbers (an empty or "-" cell is
    a missing value), the others numbers or measurements (`4.4k`, `3.12s`); any other word: not a row."""
    cells = _cells(line, sep)
    if len(cells) != len(names):
        return None
    values = [_number(c, sep) for c in cells]
    for name, value, cell in zip(names, values, cells):
        if value is None and cell not in ("", "-") and (name is not None or not _is_measure(cell)):
            return None
    return values if any(v is not None for v, n in zip(values, names) if n is not None) else None


def _epoch_step(names: list[str | None], values: list[float | None], last_step: int | None) -> int | None:
    """A table with an epoch column and no step column is one row per epoch (Chainer's PrintReport, Keras's
    CSVLogger): a whole epoch past the last row's is the row's step, so that an evaluation column does not
    count as a row of its own. A row whose epoch does not move on (a report per iteration) is the next one."""
    if "step" in names or "epoch" not in names:
        return None
    epoch = values[names.index("epoch")]
    if epoch is None or not epoch.is_integer() or last_step is not None and epoch <= last_step:
        return None if last_step is None else last_step + 1
    return int(epoch)


def _is_measure(cell: str) -> bool:
    return cell[:1].isdigit() or cell[:1] in "+-." and cell[1:2].isdigit()


class TableSource:
    name = "table"

    def sniff(self, path: Path, head: bytes) -> bool:
        lines = [line for line in head.decode("utf-8", "replace").splitlines() if line.strip()]
        for index, line in enumerate(lines[:-1]):
            if "loss" not in line.lower():
                continue
            header = _header(line)
            if header is None:
                return False  # the first line naming a loss is no table header: a text log
            following = [ln for ln in lines[index + 1:index + 3] if not _is_rule(ln)]
            return bool(following) and _values(following[0], _separator(line), header) is not None
        return False

    def parse(self, path: Path) -> Iterator[Record]:
        reader = RowReader(path.name)
        header: list[str | None] | None = None
        sep: str | None = None
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line_no, line in enumerate(handle, 1):
                line = line[:65536]
                if not line.strip() or _is_rule(line):
                    continue
                if "loss" in line.lower() and (names := _header(line)) is not None:
                    header, sep = names, _separator(line)
                    continue
                values = _values(line, sep, header) if header is not None else None
                if values is None:
                    continue
                row: dict[str, float] = {}
                epoch_step = _epoch_step(header, values, reader.last_step)
                if epoch_step is not None:
                    row["step"] = epoch_step
                for name, value in zip(header, values):
                    if name == "loss" and value is not None:
                        put_loss(row, value)  # a second loss column: its NaN is kept (generic.put_loss)
                    elif name and value is not None:
                        row[name] = value
                # A row with a train and an eval loss (the Trainer's notebook table) is two records.
                eval_loss = row.pop("eval_loss", None)
                if row.keys() - {"step", "epoch"} and (record := reader.record(line_no, row)) is not None:
                    yield record
                if eval_loss is not None:
                    where = {k: row[k] for k in ("step", "epoch") if k in row}
                    if (record := reader.record(line_no, {**where, "eval_loss": eval_loss})) is not None:
                        yield record
