"""Versions on the page: which package versions each finding assumed and where they came from, and what a
version-window rule would say on the releases still in wide use when it is clean for the assumed one.

A config is shared across clusters: "clean on 0.19.8" is half the answer when 0.12.6 is pinned elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from packaging.version import Version

from lossguard.core.findings import Finding, Severity
from lossguard.core.versions import parse
from lossguard.knowledge import get_issue
from lossguard.lint.context import LintContext

__all__ = ["PACKAGES", "WIDE_USE_FROM", "other_versions", "stamp", "versions_line"]

PACKAGES = ("deepspeed", "transformers", "torch", "accelerate", "peft")
# Oldest release still in wide use per package (2023 on: the pins in the issue #15 survey reach back to
# DeepSpeed 0.12.6, transformers 4.37, torch 2.1). Windows that end before these are not probed.
WIDE_USE_FROM = {"deepspeed": "0.10.0", "transformers": "4.36.0", "torch": "2.1.0", "accelerate": "0.25.0",
                 "peft": "0.7.0"}
_NAMES = {"deepspeed": "DeepSpeed"}


def origin_of(ctx: LintContext, dist: str) -> str:
    return ctx.options.get("version_origin", "given") if ctx.version(dist) else "unknown"


def stamp(findings: Iterable[Finding], ctx: LintContext, read: set[str]) -> None:
    """Record in each finding the versions its rule read, with their origin (installed, --env FILE, unknown)."""
    assumed = {dist: {"version": ctx.versions.get(dist), "from": origin_of(ctx, dist)} for dist in sorted(read)}
    for finding in findings:
        if assumed:
            finding.data["versions"] = assumed


def versions_line(versions: dict[str, str], origin: str) -> str:
    """One line for the top of the human report: the versions lint assumed and where from."""
    known = [f"{_NAMES.get(d, d)} {versions[d]}" for d in PACKAGES if versions.get(d)]
    unknown = [_NAMES.get(d, d) for d in PACKAGES if not versions.get(d)]
    parts = [f"{', '.join(known)} ({origin})"] if known else []
    if unknown:
        parts.append(f"{', '.join(unknown)} unknown")
    return "versions assumed: " + "; ".join(parts)


def other_versions(rule: Any, ctx: LintContext, read: set[str]) -> Finding | None:
    """For a rule clean at the assumed version: an info naming the windows in wide use where it would fire."""
    spans: dict[str, list[tuple[Version, Version | None]]] = {}
    for dist, window in _windows(rule, read):
        probe = _probe_version(dist, window, ctx.versions.get(dist))
        if probe is None:
            continue
        if _fires(rule, ctx, dist, probe) and not _fires(rule, _blank(ctx), dist, probe):  # the config's hazard,
            # not a release bug every config on that version has (those belong to whoever pins it)
            spans.setdefault(dist, []).append((Version(probe), parse(window.high) if window.high else None))
    if not spans:
        return None
    dist, ranges = next(iter(spans.items()))
    hits = [_range_text(dist, low, high) for low, high in _merged(ranges)]
    message = (f"safe on {_NAMES.get(dist, dist)} {ctx.versions.get(dist)} ({origin_of(ctx, dist)}); "
               f"{' and '.join(hits)} {'is' if len(hits) == 1 else 'are'} affected: a cluster pinned there gets "
               "this finding (lint there with --env FREEZE)")
    finding = rule.finding(ctx, message, "env." + dist, severity=Severity.INFO)
    finding.data["affected"] = hits
    return finding


def _fires(rule: Any, ctx: LintContext, dist: str, version: str) -> bool:
    saved = ctx.versions
    ctx.versions = {**saved, dist: version}
    try:
        return any(f.severity >= Severity.WARNING for f in rule.check(ctx))
    finally:
        ctx.versions = saved


def _blank(ctx: LintContext) -> LintContext:
    return LintContext(raw={}, args=ctx.args, versions=ctx.versions, source=ctx.source, options=ctx.options)


def _merged(ranges: list[tuple[Version, Version | None]]) -> list[tuple[Version, Version | None]]:
    out: list[tuple[Version, Version | None]] = []
    for low, high in sorted(ranges, key=lambda r: r[0]):
        if out and (out[-1][1] is None or low <= out[-1][1]):
            prev_low, prev_high = out[-1]
            out[-1] = (prev_low, None if prev_high is None or high is None else max(prev_high, high))
        else:
            out.append((low, high))
    return out


def _range_text(dist: str, low: Version, high: Version | None) -> str:
    name = _NAMES.get(dist, dist)
    return f"{name} >= {low}, < {high}" if high else f"{name} >= {low}"


def _windows(rule: Any, read: set[str]) -> list[tuple[str, Any]]:
    out = []
    for issue_id in getattr(rule, "issues", ()):
        issue = get_issue(issue_id)
        for window in issue.windows if issue else ():
            if window.package in read:
                out.append((window.package, window))
    return out


def _probe_version(dist: str, window: Any, current: str | None) -> str | None:
    """A version inside the window and in wide use; None when the window is the current one, or out of use."""
    now = parse(current)
    if now is None or window.contains(current):
        return None
    floor = Version(WIDE_USE_FROM.get(dist, "0"))
    high = parse(window.high) if window.high else None
    if high is not None and high <= floor:
        return None
    low = parse(window.low) if window.low else floor
    probe = max(low, floor)
    return str(probe) if high is None or probe < high else None
