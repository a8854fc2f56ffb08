"""Runs of plain train records, for the engine's fast path over big logs.

A million-line log holds tens of thousands of train logs in which nothing happens: finite losses,
moving learning rates, no events. Feeding them one at a time through thirteen detectors costs ~10 µs
each. `Engine.feed_all` instead builds a `Batch` of consecutive records (one rank, train records with
numbers only) and evaluates each detector's declarative `spared_when` tests on its columns
(core/detector.py); the loss profile (core/profile.py) and the signal counts take the same columns. Only
the records that fail
a detector's tests, or that the profile marks, reach `observe`, the one implementation of every rule;
tests hold both paths to the same findings on every fixture.
"""

from __future__ import annotations

import itertools

from lossguard.core.records import Record


class Batch:
    """Consecutive train records of one rank, with aligned columns per signal (None where a record
    lacks the signal), built once and shared by every detector."""

    __slots__ = ("records", "rank", "steps", "columns")

    def __init__(self, records: list[Record]) -> None:
        self.records = records
        self.rank = records[0].rank
        self.steps = [r.step for r in records]
        signals = [r.signals for r in records]
        # Every name any record has (a C-speed union), sorted so that the order is the same every run.
        self.columns = {name: list(map(dict.get, signals, itertools.repeat(name)))  # C-speed, per name
                        for name in sorted(set().union(*signals))}

    def column(self, name: str) -> list[float | None]:
        """Values of `name` aligned with `records`; an all-None list when no record has it."""
        column = self.columns.get(name)
        return column if column is not None else [None] * len(self.records)

    def present(self, name: str) -> list[float]:
        """The values of `name` that are there, in order."""
        column = self.columns.get(name)
        if column is None:
            return []
        return [v for v in column if v is not None] if None in column else column
