"""The shape of a known issue: a bug or mistake that kills fine-tuning runs, its affected versions and the
config it needs, what it looks like, how to confirm it and how to fix it. Frozen data, checked on load."""

from __future__ import annotations

from dataclasses import dataclass

from lossguard.core import versions

PACKAGES = ("deepspeed", "torch", "transformers", "peft", "accelerate")
_PACKAGE_NAMES = {"deepspeed": "DeepSpeed", "torch": "torch", "transformers": "transformers", "peft": "peft",
                  "accelerate": "accelerate"}


@dataclass(frozen=True, slots=True)
class VersionWindow:
    """Versions of one package with the bug: low <= version < high (an open end is None)."""

    package: str
    low: str | None = None
    high: str | None = None

    def __post_init__(self) -> None:
        if self.package not in PACKAGES:
            raise ValueError(f"unknown package {self.package!r}; one of {PACKAGES}")
        for bound in (self.low, self.high):
            if bound is not None and versions.parse(bound) is None:
                raise ValueError(f"{self.package} window bound {bound!r} is not a version")

    def contains(self, version: str | None) -> bool | None:
        """True inside the window, False outside, None when the version is unknown."""
        return versions.in_range(version, self.low, self.high)

    @property
    def fact(self) -> str:
        """The RunFacts field holding this package's version."""
        return f"{self.package}_version"

    def __str__(self) -> str:
        name = _PACKAGE_NAMES[self.package]
        if self.low and self.high:
            return f"{name} >= {self.low}, < {self.high}"
        if self.low:
            return f"{name} >= {self.low}"
        return f"{name} < {self.high}" if self.high else f"every {name} release"


@dataclass(frozen=True, slots=True)
class KnownIssue:
    """One entry of the known-issues table; `id` is stable: output, docs and `lossguard explain` cite it."""

    id: str
    title: str
    mechanism: str
    fix: str
    confirm: str
    windows: tuple[VersionWindow, ...] = ()  # empty: not tied to a release
    config: str = ""  # the configuration it needs, in words ("ZeRO-1/2, overlap_comm true, more than one rank")
    symptoms: str = ""  # what the log shows
    sources: tuple[str, ...] = ()  # primary links: issues, pull requests

    def __post_init__(self) -> None:
        if not self.id or self.id != self.id.lower() or " " in self.id:
            raise ValueError(f"known-issue id {self.id!r} must be lower-case-with-dashes")
        for text in (self.title, self.mechanism, self.fix, self.confirm):
            if not text.strip():
                raise ValueError(f"known issue {self.id}: title, mechanism, fix and confirm are required")
        bad = [s for s in self.sources if not s.startswith("https://")]
        if bad:
            raise ValueError(f"known issue {self.id}: sources must be https links, got {bad}")

    def window(self, package: str) -> VersionWindow | None:
        """The first window for `package` (most issues have one)."""
        return next((w for w in self.windows if w.package == package), None)

    def affects(self, package: str, version: str | None) -> bool | None:
        """Is this version of `package` in one of the issue's windows? None when unknown or not tied to it."""
        hits = [w.contains(version) for w in self.windows if w.package == package]
        if not hits or None in hits:
            return None
        return any(hits)
