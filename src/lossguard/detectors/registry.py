"""The registry of built-in detectors: a plain list of factories, so tests can run every registered
detector generically. It lives here, beside the detectors, so that core/ never imports what sits on it:
callers build the detectors (`make_detectors()`) and hand them to the engine."""

from __future__ import annotations

from collections.abc import Callable

from lossguard.core.detector import Detector

_REGISTRY: list[Callable[[], Detector]] = []


def register(factory: Callable[[], Detector]) -> Callable[[], Detector]:
    _REGISTRY.append(factory)
    return factory


def registered() -> list[Callable[[], Detector]]:
    # Complete without importing anything here: importing this module ran the package `__init__` first,
    # and its explicit list of detector modules registered each of them (a late import of the package
    # would be an import cycle, registry -> package -> detector -> registry).
    return list(_REGISTRY)


def make_detectors() -> list[Detector]:
    return [factory() for factory in registered()]
