"""Column tests: what a detector's `spared_when` (core/detector.py) is made of.

A test takes a column (a signal's values over a run of records, None where a record lacks the signal) and
answers for all of it at C speed: True when no value in it concerns the detector. The engine clears a run of
512 records with one call per (signal, test) and routes only the records whose value fails a test.
"""

from __future__ import annotations

import math


def nonzero(column: list) -> bool:
    """No exact 0 (NaN and None pass)."""
    return 0.0 not in column


def finite(column: list) -> bool:
    """No NaN/Inf (None ignored). Summing is C-speed; a sum that overflows on huge but finite values
    fails the test, which only routes the records to the detector."""
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
