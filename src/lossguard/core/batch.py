"""Runs of plain train records, for the engine's fast path over big logs.

A million-line log holds tens of thousands of train logs in which nothing happens: finite losses,
moving learning rates, no events. Feeding them one at a time through thirteen detectors costs ~10 µs
each. `Engine.feed_all` instead hands a detector a `Batch` of consecutive records (one rank, train
records with numbers only) and asks it to `absorb` them: a detector that can prove none of them would
raise a finding updates its state exactly as `observe` would have and returns True; otherwise it
returns False *without touching its state*, and the engine feeds it those records one by one. So the
answer never depends on the path: findings only ever come from `observe`, and tests hold the two
paths to the same findings and the same detector state on every fixture.
"""

from __future__ import annotations

import math
import operator

from lossguard.core.records import Record


class Batch:
    """Consecutive train records of one rank, with aligned columns per signal (None where a record
    lacks the signal), built once and shared by every detector."""

    __slots__ = ("records", "rank", "steps", "columns", "_train_losses", "_train_loss_values")

    def __init__(self, records: list[Record]) -> None:
        self.records = records
        self.rank = records[0].rank
        self.steps = [r.step for r in records]
        signals = [r.signals for r in records]
        # Every name any record has (a C-speed union), sorted so that the order is the same every run.
        self.columns = {name: [one.get(name) for one in signals] for name in sorted(set().union(*signals))}
        self._train_losses: list[tuple[Record, float]] | None = None
        self._train_loss_values: list[float] | None = None

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

    def train_losses(self) -> list[tuple[Record, float]]:
        """(record, loss) for each record with a finite loss (the raw loss where a record has one): what
        the loss-trend detectors read, computed once for all of them."""
        if self._train_losses is None:
            losses = self.column("loss")
            raw = self.columns.get("raw_loss")
            if raw is not None:
                losses = [r if r is not None else v for r, v in zip(raw, losses)]
            self._train_losses = [(record, loss) for record, loss in zip(self.records, losses)
                                  if loss is not None and math.isfinite(loss)]
        return self._train_losses

    def train_loss_values(self) -> list[float]:
        """The losses of `train_losses()` alone, computed once."""
        if self._train_loss_values is None:
            self._train_loss_values = [loss for _, loss in self.train_losses()]
        return self._train_loss_values


def grows(values: list[float], start: float | None = None) -> bool:
    """True when some value is larger than the one before it (the first compared with `start`)."""
    if start is not None and values and values[0] > start:
        return True
    return any(map(operator.lt, values, values[1:]))
