"""One code per condition: each no-gradient and flat-loss condition has its own code, shown here with
example record streams that raise it and near misses that must not (as lint rules carry example configs).
The streams go through the whole engine and every built-in detector, so a code that another detector
shadows or a condition reported under the wrong code fails here."""

import math

import pytest

from lossguard.core.engine import Engine
from lossguard.core.records import Record, event
from lossguard.detectors import make_detectors


def codes(records) -> dict[str, str | None]:
    """code -> signature of every finding the stream raises."""
    engine = Engine(make_detectors())
    engine.feed_all(records)
    return {f.code: f.signature for f in engine.finish().findings}


def train(rows, start=1):
    """(loss, grad_norm) rows -> train records at steps start, start+1, ..."""
    return [Record(step=start + i, signals={"loss": loss, "grad_norm": grad, "lr": 1e-4})
            for i, (loss, grad) in enumerate(rows)]


def flat(grad: float, n: int = 30) -> list[Record]:
    """A loss wandering within 0.5% of 4.15 (never the same value twice) from step 1."""
    return train([(4.15 + 0.01 * math.sin(i), grad) for i in range(n)])


EXAMPLES = {
    "GRAD002": (train([(2.3, 0.0), (2.3, 0.0), (2.29, 0.0)]), "no-grad-flow"),
    "GRAD003": ([event("trainable-params", step=None, count=0)] + train([(2.3, 1.0), (2.2, 0.9)]),
                "no-grad-flow"),
    "GRAD004": ([event("no-grad", step=1, rank=0, count=3, num_trainable=3, params=["a", "b", "c"])],
                "no-grad-flow"),
    "GRAD005": ([event("trainable-not-in-optimizer", step=1, rank=0, count=1, params=["head.weight"])],
                "no-grad-flow"),
    "LOSS004": (flat(grad=1.3), "not-learning"),
    "LOSS008": (flat(grad=0.03), "no-grad-flow"),
}

NEAR_MISSES = {
    "GRAD002": train([(2.3, 0.0), (2.3, 1.0), (2.29, 0.0), (2.28, 1.1)]),  # never two zeros in a row
    "GRAD003": [event("trainable-params", step=None, count=1024)] + train([(2.3, 1.0), (2.2, 0.9)]),
    "GRAD004": train([(2.3, 1.0), (2.2, 0.9)]),
    "GRAD005": train([(2.3, 1.0), (2.2, 0.9)]),
    "LOSS004": train([(4.0 * 0.97 ** i, 1.3) for i in range(30)]),  # a loss that learns
    "LOSS008": flat(grad=1.3),  # flat, but the gradient is healthy: LOSS004's
}


@pytest.mark.parametrize("code", list(EXAMPLES))
def test_each_condition_raises_its_own_code(code):
    stream, signature = EXAMPLES[code]
    found = codes(stream)
    assert found.get(code) == signature, found


@pytest.mark.parametrize("code", list(NEAR_MISSES))
def test_near_misses_stay_quiet(code):
    assert code not in codes(NEAR_MISSES[code])


def test_a_flat_run_is_one_code_not_two():
    assert "LOSS004" not in codes(flat(grad=0.03))
    assert "LOSS008" not in codes(flat(grad=1.3))


def test_later_conditions_are_not_lost_as_repeats_of_the_first():
    """Before each had its own code, a no-grad event after a zero grad norm was only an occurrence count."""
    stream = train([(2.3, 0.0), (2.3, 0.0)]) + [
        event("no-grad", step=3, rank=0, count=2, num_trainable=4, params=["a", "b"]),
        event("trainable-not-in-optimizer", step=3, rank=0, count=1, params=["c"])]
    assert {"GRAD002", "GRAD004", "GRAD005"} <= set(codes(stream))
