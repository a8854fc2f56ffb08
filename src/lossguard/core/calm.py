"""Calm records: the declarative half of the engine's fast path.

A detector may declare `calm = {signal: test}`: a record is of no interest to it when, for every named
signal the record carries, `test([value])` is True. `test` takes a column (a list of values, None where
a record lacks the signal) and answers for all of it at C speed, so the engine can clear a run of 512
records with one call per signal and route only the records that fail a test to the detector's
`observe`. There is no second code path to keep in step: a detector with `calm` is written so that
skipping its calm records cannot change what it reports; what it must know about them (how many came
between two records it saw) it reads from the `SignalCounts` the engine binds to it. `calm` may be a
property of the detector's state (None: every record); since a calm record changes no state, the engine
re-reads it only after a record it routed to that detector.
"""

from __future__ import annotations

import itertools
import math


def nonzero(column: list) -> bool:
    """No exact 0 (NaN and None are calm here)."""
    return 0.0 not in column


def finite(column: list) -> bool:
    """No NaN/Inf (None ignored). Summing is C-speed; a sum that overflows on huge but finite values
    reads as "not calm", which only routes the records to the detector."""
    return math.isfinite(sum(filter(None, column)))


def finite_nonzero(column: list) -> bool:
    """Both `finite` and `nonzero`."""
    return 0.0 not in column and finite(column)


def zero(column: list) -> bool:
    """Every value is 0 or missing (a skipped-step count that never moved off 0)."""
    return column.count(None) + column.count(0.0) == len(column)


def absent(column: list) -> bool:
    """No record carries the signal."""
    return column.count(None) == len(column)


class SignalCounts:
    """Per (rank, signal): how many train records carried the signal so far, the current one included,
    and the last three values. Two records a detector saw are "in a row" for a signal when their counts
    differ by one: calm records skipped between them still advanced the count. One definition of
    consecutive for all, and one update path (`advance`) for a run of records or a single one."""

    __slots__ = ("_state",)

    def __init__(self) -> None:
        # (rank, signal) -> [count, last value, the one before, the one before that]: one lookup per update.
        self._state: dict[tuple[int | None, str], list] = {}

    def seq(self, rank: int | None, name: str) -> int:
        entry = self._state.get((rank, name))
        return entry[0] if entry is not None else 0

    def last(self, rank: int | None, name: str) -> float | None:
        """The value in the latest record counted (at `seq`)."""
        entry = self._state.get((rank, name))
        return entry[1] if entry is not None else None

    def previous(self, rank: int | None, name: str) -> float | None:
        """The value in the record counted before the latest (at `seq - 1`)."""
        entry = self._state.get((rank, name))
        return entry[2] if entry is not None else None

    def earlier(self, rank: int | None, name: str) -> float | None:
        """The value in the record counted two before the latest (at `seq - 2`)."""
        entry = self._state.get((rank, name))
        return entry[3] if entry is not None else None

    def advance(self, rank: int | None, columns: dict[str, list], lo: int, hi: int) -> None:
        """Records lo..hi-1 of a run, from its columns (None where a record lacks the signal)."""
        state = self._state
        if hi - lo == 1:  # the common call (a routed record): the same update without slicing
            for name, column in columns.items():
                if (value := column[lo]) is not None:
                    entry = state.get((rank, name))
                    if entry is None:
                        state[(rank, name)] = [1, value, None, None]
                    else:
                        entry[0] += 1
                        entry[3], entry[2], entry[1] = entry[2], entry[1], value
            return
        for name, column in columns.items():
            part = column[lo:hi]
            present = len(part) - part.count(None)
            if not present:
                continue
            entry = state.get((rank, name))
            if entry is None:
                entry = state[(rank, name)] = [0, None, None, None]
            tail = list(itertools.islice((value for value in reversed(part) if value is not None), 3))
            # Older values shift down by as many places as this part brought new ones (at most three).
            older = [*tail, entry[1], entry[2], entry[3]]
            entry[0] += present
            entry[1], entry[2], entry[3] = older[0], older[1], older[2]
