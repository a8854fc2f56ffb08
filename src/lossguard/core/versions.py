"""Installed-version snapshots: parse `pip freeze`, `pip list` or `lossguard env` text; compare versions.

Pure text handling on top of `packaging`, so lint and analyze run without the packages installed.
"""

from __future__ import annotations

import re

from packaging.version import InvalidVersion, Version

# `name==1.2.3`, `name===1.2.3`, `name: 1.2.3`, `- name: 1.2.3`, `name 1.2.3` (pip list), `name @ url`.
_LINE = re.compile(r"^\s*(?:[-*]\s*)?([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:===?|:|\s)\s*v?([0-9][^\s;#,]*)")


def parse_versions(text: str) -> dict[str, str]:
    """Distribution name (normalised, lower-case, '-' separators) -> version string."""
    versions: dict[str, str] = {}
    for line in text.splitlines():
        match = _LINE.match(line)
        if match:
            name = re.sub(r"[-_.]+", "-", match.group(1)).lower()
            versions.setdefault(name, match.group(2))
    return versions


def parse(version: str | None) -> Version | None:
    """A comparable version, ignoring local tags (`2.13.0+cpu` -> 2.13.0); None when unparsable."""
    if not version:
        return None
    try:
        return Version(Version(version).base_version)
    except InvalidVersion:
        return None


def in_range(version: str | None, low: str | None = None, high: str | None = None) -> bool | None:
    """low <= version < high; None when the version is unknown."""
    parsed = parse(version)
    if parsed is None:
        return None
    if low is not None and parsed < Version(low):
        return False
    return not (high is not None and parsed >= Version(high))
