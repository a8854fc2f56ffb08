"""Bounded per-signal series for plots and timelines: memory stays flat however long the run.

Display only: detectors see every record; this keeps every k-th point and doubles k when full.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from lossguard.core.column_tests import finite


@dataclass(slots=True)
class Downsampled:
    capacity: int = 2048
    stride: int = 1
    seen: int = 0
    points: list[tuple[int, float]] = field(default_factory=list)
    transitions: int = 0

    def add(self, step: int, value: float) -> None:
        # A lone NaN between kept points would vanish from the plot: keep every finite -> non-finite
        # transition (bounded, so a run that is NaN at every step still costs O(capacity)).
        if not math.isfinite(value) and self.points and math.isfinite(self.points[-1][1]) \
                and self.seen % self.stride != 0 and self.transitions < self.capacity // 8:
            self.points.append((step, value))
            self.transitions += 1
        if self.seen % self.stride == 0:
            self.points.append((step, value))
            if len(self.points) >= self.capacity:
                self.points = self.points[::2]
                self.stride *= 2
        self.seen += 1

    def add_many(self, steps: list[int], values: list[float]) -> None:
        """`add` for each pair, jumping straight to the points it keeps when every value is finite."""
        if not finite(values):
            for step, value in zip(steps, values):
                self.add(step, value)
            return
        i, size = 0, len(values)
        while i < size:
            gap = -self.seen % self.stride  # values until the next kept one
            if i + gap >= size:
                self.seen += size - i
                return
            i += gap
            self.seen += gap
            # Every stride-th value from here, as many as fit before the points are halved: one slice.
            stride = self.stride
            take = min(self.capacity - len(self.points), (size - 1 - i) // stride + 1)
            last = i + (take - 1) * stride
            self.points.extend(zip(steps[i:last + 1:stride], values[i:last + 1:stride]))
            if len(self.points) >= self.capacity:
                self.points = self.points[::2]
                self.stride *= 2
            self.seen += last - i + 1
            i = last + 1


@dataclass(slots=True)
class SeriesBook:
    """(signal, rank) -> Downsampled. Rank None means the run-level (averaged) log."""

    capacity: int = 2048
    series: dict[tuple[str, int | None], Downsampled] = field(default_factory=dict)

    def add(self, signal: str, rank: int | None, step: int, value: float) -> None:
        key = (signal, rank)
        line = self.series.get(key)
        if line is None:
            line = self.series[key] = Downsampled(capacity=self.capacity)
        line.add(step, value)

    def add_many(self, signal: str, rank: int | None, steps: list[int], values: list[float]) -> None:
        key = (signal, rank)
        line = self.series.get(key)
        if line is None:
            line = self.series[key] = Downsampled(capacity=self.capacity)
        line.add_many(steps, values)

    def to_dict(self) -> dict[str, dict[str, list[tuple[int, float]]]]:
        out: dict[str, dict[str, list[tuple[int, float]]]] = {}
        for (signal, rank), line in sorted(self.series.items(), key=lambda kv: (kv[0][0], kv[0][1] or -1)):
            out.setdefault(signal, {})["all" if rank is None else f"rank{rank}"] = line.points
        return out
