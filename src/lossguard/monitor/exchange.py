"""Which collectives a step takes, decided alike on every rank, and what they return.

Up to `detail_every_step_up_to` ranks: the gather of every rank's row, every step. Above it: the gather on
the steps known in advance to need it (the first step, the `summary.DETAIL_AFTER` steps after one that
showed something), else the all_reduce of the summary, then the gather only when the summary gives a
reason (`summary.reasons`: on a fingerprint step, fingerprints that differ). The schedule and the summary are the same on every rank, so
the sequence of collectives is too.
"""

from __future__ import annotations

from typing import Any

import torch

from lossguard.monitor import dist, summary, wire


class Exchange:
    def __init__(self, layout: wire.Layout, world_size: int, detail_up_to: int) -> None:
        self.layout = layout
        self.summarised = world_size > detail_up_to
        # `gather_rows` and `reduce_summary`: `dist`; a simulated world of many ranks in bench/scale.py and
        # the unit tests (what those collectives would return there).
        self.collectives: Any = dist
        self.detail_until = 0  # steps up to this one gather (after a step whose summary showed something)
        self.skip_range: tuple[float, float] | None = None  # the last step's (fewest, most) skipped steps
        self.steps_by_path = {"detail": 0, "summary": 0}

    def step(self, step: int, first: bool, vector: torch.Tensor):
        """(every rank's row, or None on a step read from the summary alone; the step's summary, None
        below the threshold; this rank's own row on a summary-only step).
        SYNC POINTS: one host copy per step (the gather's or the reduction's), two on a step whose
        summary shows something (the reduction's, then the gather's)."""
        world = self.collectives
        if not self.summarised:
            self.steps_by_path["detail"] += 1
            return wire.fold_shard_norms(world.gather_rows(vector)), None, None
        if first or step <= self.detail_until:  # known in advance: no reduction
            rows = wire.fold_shard_norms(world.gather_rows(vector))
            seen = summary.of_rows(self.layout, rows)
            self.note(step, seen)
            self.steps_by_path["detail"] += 1
            return rows, seen, None
        reduced, own = world.reduce_summary(*summary.contributions(self.layout, vector), vector)
        seen = summary.fold_shard_norm(summary.Summary.read(self.layout, reduced))
        if self.note(step, seen):
            self.steps_by_path["detail"] += 1
            return wire.fold_shard_norms(world.gather_rows(vector)), seen, None
        self.steps_by_path["summary"] += 1
        return None, seen, own

    def note(self, step: int, seen: summary.Summary) -> list[str]:
        """Why this step needs every rank's row (empty: it does not); the steps just after one that does are
        looked at in detail too."""
        reasons = summary.reasons(seen, self.skip_range)
        self.skip_range = seen.skip_range()
        if reasons:
            self.detail_until = max(self.detail_until, step + summary.DETAIL_AFTER)
        return reasons
