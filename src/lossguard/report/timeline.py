"""The rows of the "around the onset" table, for the terminal and the HTML report.

The engine keeps the records around the first warning it raised, which is not always the onset the
diagnosis settles on: a finding confirmed at the end of the log, a signature chosen over an earlier
warning, or per-rank files merged after one another. The table shows the records within a few steps of
the diagnosis's onset, in step order; when the kept records do not reach it, the rows are rebuilt from
the run's display series around the onset (thinned on long runs, like the plots).
"""

from __future__ import annotations

from lossguard.core.records import EVENT, Record

BEFORE, AFTER = 5, 6  # steps shown before and after the onset
_HIDDEN_EVENTS = ("facts", "train-summary")


def onset_rows(diagnosis) -> list[Record]:
    result, onset = diagnosis.result, diagnosis.onset_step
    kept = [r for r in result.onset_window if r.kind != EVENT or r.event not in _HIDDEN_EVENTS]
    if onset is None:
        return sorted(kept, key=_order)
    near = [r for r in kept if r.step is not None and onset - BEFORE <= r.step <= onset + AFTER]
    if any(r.step == onset for r in near):
        return sorted(near, key=_order)
    return _from_series(result.series, onset) or sorted(near, key=_order)


def _order(record: Record) -> tuple:
    return (record.step is None, record.step or 0, record.rank if record.rank is not None else -1)


def _from_series(series, onset: int) -> list[Record]:
    rows: dict[tuple[int, int | None], Record] = {}
    for (signal, rank), line in series.series.items():
        for step, value in line.points:
            if onset - BEFORE <= step <= onset + AFTER:
                row = rows.setdefault((step, rank), Record(step=step, rank=rank))
                row.signals[signal] = value
    return sorted(rows.values(), key=_order)
