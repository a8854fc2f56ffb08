"""What every detector may read about the records the engine spared it: per rank and signal, how many
train records carried the signal and the last values. The engine advances one `SignalCounts` on both of its
paths and binds it to each detector (core/detector.py), so a detector reads them instead of observing every
record.
"""

from __future__ import annotations

import itertools


class SignalCounts:
    """Per (rank, signal): how many train records carried the signal so far, the current one included,
    and the last three values, spared records' included; one update path (`advance`) for a run of
    records or a single one."""

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
