"""Built-in detectors. Importing this package registers each of them; `make_detectors()` builds one of
each for an engine."""

from lossguard.detectors import chance, evaluation, nonfinite, overflow, ranks, repeats, trends, zeros  # noqa: F401
from lossguard.detectors.registry import make_detectors, register, registered

__all__ = ["make_detectors", "register", "registered"]
