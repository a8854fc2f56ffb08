"""Built-in detectors. Importing this package registers each of them (see core.detector.registered)."""

from lossguard.detectors import nonfinite, overflow, ranks, trends, zeros  # noqa: F401
