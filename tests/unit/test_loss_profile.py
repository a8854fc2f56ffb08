"""The loss profile's recurrence marks (LOSS009's reading), held to a brute-force reading of the same losses."""

import math
import random

from lossguard.core.profile import _RECUR_DISTINCT, RECUR_LOGS, RankProfile


def _reference_recurs(losses: list[float]) -> dict[int, int]:
    """index -> how many non-zero losses ago the last RECUR_LOGS non-zero losses were first seen, value for value."""
    seen: dict[tuple, int] = {}
    window: list[float] = []
    out: dict[int, int] = {}
    nonzero = 0
    for index, loss in enumerate(losses):
        if not math.isfinite(loss) or loss == 0.0:
            continue
        nonzero += 1
        window = (window + [loss])[-RECUR_LOGS:]
        key = tuple(window)
        if len(key) < RECUR_LOGS or len(set(key)) < _RECUR_DISTINCT:
            continue
        if key in seen:
            out[index] = nonzero - seen[key]
        else:
            seen[key] = nonzero
    return out


def test_recurrences_are_found_as_a_brute_force_reading_finds_them_whatever_the_batch_boundaries():
    rng = random.Random(7)
    for trial in range(60):
        # Few distinct values, zeros and NaNs among them, and stretches copied from earlier in the run.
        values = [rng.choice([1.5, 2.0, 2.5, 3.0, 0.0, math.nan]) if trial % 2 else round(rng.uniform(1, 3), 1)
                  for _ in range(rng.randrange(10, 40))]
        losses = list(values)
        while len(losses) < 400:
            losses += values[rng.randrange(len(values)):] if rng.random() < 0.5 else [rng.choice(values)]
        profile, marks, lo = RankProfile(), {}, 0
        while lo < len(losses):
            hi = min(len(losses), lo + rng.randrange(1, 50))
            marks.update(profile.run(losses, list(range(len(losses))), [None] * len(losses), lo, hi))
            lo = hi
        found = {index: reading.recurs for index, reading in marks.items() if reading.recurs is not None}
        assert found == _reference_recurs(losses), trial
        assert found or trial % 2 == 0
