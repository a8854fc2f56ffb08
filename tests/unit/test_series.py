"""The display series: `add_many` keeps exactly the points `add` one by one keeps."""

import math
import random

import pytest

from lossguard.core.series import Downsampled


@pytest.mark.parametrize("capacity", [4, 8, 64, 2048])
def test_add_many_keeps_what_add_keeps(capacity):
    rng = random.Random(capacity)
    for _ in range(50):
        many, one = Downsampled(capacity=capacity), Downsampled(capacity=capacity)
        step = 0
        for _ in range(rng.randrange(1, 30)):
            size = rng.randrange(1, 700)
            steps = list(range(step, step + size))
            step += size
            values = [rng.random() if rng.random() > 0.01 else math.nan for _ in range(size)]
            many.add_many(steps, values)
            for at, value in zip(steps, values):
                one.add(at, value)
            assert (repr(many.points), many.stride, many.seen, many.transitions) == \
                (repr(one.points), one.stride, one.seen, one.transitions)
