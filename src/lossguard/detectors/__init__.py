"""Built-in detectors. Importing this package registers each of them; `make_detectors()` builds one of
each for an engine."""

from lossguard.detectors import (  # noqa: F401
    chance,
    evaluation,
    guard_report,
    nonfinite,
    nonfinite_hidden,
    overflow,
    overflow_lr,
    ranks,
    repeats,
    rl,
    trends,
    zeros,
    zeros_loss,
)
from lossguard.detectors.registry import make_detectors, register, registered

__all__ = ["make_detectors", "register", "registered"]
