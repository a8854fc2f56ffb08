"""The known-issues table: one home for the domain facts lint rules, the cause ranking, `lossguard explain`
and docs/causes.md read (ids, affected versions, config, symptoms, fix, confirmation, sources).

Pure data on top of `core`; `core` never imports it.
"""

from __future__ import annotations

from lossguard.knowledge import deepspeed, fsdp, training
from lossguard.knowledge.issue import KnownIssue, VersionWindow

ISSUES: dict[str, KnownIssue] = {}
for _issue in (*deepspeed.ISSUES, *training.ISSUES, *fsdp.ISSUES):
    if _issue.id in ISSUES:
        raise ValueError(f"known issue id {_issue.id!r} is used twice")
    ISSUES[_issue.id] = _issue


def get_issue(issue_id: str) -> KnownIssue | None:
    return ISSUES.get(issue_id.strip().lower())


__all__ = ["ISSUES", "KnownIssue", "VersionWindow", "get_issue"]
