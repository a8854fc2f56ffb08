"""The lint rule protocol: one check is one class with a stable code, a dotted name, a severity, a
docstring (what, why, fix, evidence) and examples that run as tests.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from lossguard.core.findings import Finding, Severity
from lossguard.lint.context import LintContext, split


@dataclass(frozen=True, slots=True)
class Edit:
    op: str  # "set" or "delete"
    path: tuple[str, ...]
    value: Any = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"op": self.op, "path": ".".join(self.path)}
        if self.op == "set":
            out["value"] = self.value
        return out


@dataclass(frozen=True, slots=True)
class Fix:
    description: str
    safe: bool
    edits: tuple[Edit, ...] = ()  # empty: a manual fix (training arguments, versions)

    def to_dict(self) -> dict[str, Any]:
        return {"description": self.description, "safe": self.safe, "applicable": bool(self.edits),
                "edits": [e.to_dict() for e in self.edits]}


def set_(path: str, value: Any) -> Edit:
    return Edit("set", split(path), value)


def delete(path: str) -> Edit:
    return Edit("delete", split(path))


@dataclass(frozen=True, slots=True)
class Example:
    """A config the rule must flag (valid=False) or must not (valid=True); `fixed` is what --fix makes."""

    config: dict[str, Any]
    valid: bool
    args: dict[str, Any] | None = None
    env: dict[str, str] = field(default_factory=dict)
    fixed: dict[str, Any] | None = None
    note: str = ""
    options: dict[str, Any] = field(default_factory=dict)


class Rule:
    code: ClassVar[str]
    name: ClassVar[str]
    severity: ClassVar[Severity]
    summary: ClassVar[str]
    evidence: ClassVar[tuple[str, ...]] = ()
    examples: ClassVar[tuple[Example, ...]] = ()
    signature: ClassVar[str | None] = None  # the DESIGN.md failure signature this rule prevents
    issues: ClassVar[tuple[str, ...]] = ()  # known-issue ids (lossguard.knowledge) whose windows the rule reads
    # The code of a finding with the same root cause whose fix also removes this one: when both fire, this one
    # is told inside it (one finding per cause), and its own fix waits for the next round.
    root_cause: ClassVar[str | None] = None
    # The engines whose runs the rule reads: DeepSpeed config rules say nothing about an FSDP run.
    engines: ClassVar[tuple[str, ...]] = ("deepspeed",)

    @classmethod
    def doc(cls) -> str:
        import inspect  # lazy: inspect pulls in ast, which `lossguard lint` does not need

        return inspect.cleandoc(cls.__doc__ or "")

    def check(self, ctx: LintContext) -> Iterable[Finding]:  # pragma: no cover - abstract
        raise NotImplementedError

    def finding(self, ctx: LintContext, message: str, path: str, *, fix: Fix | None = None,
                severity: Severity | None = None, **data: Any) -> Finding:
        payload: dict[str, Any] = {"fix": fix.to_dict() if fix else None, "evidence": list(self.evidence[:3])}
        payload.update(data)
        return Finding(code=self.code, name=self.name, severity=severity or self.severity, message=message,
                       signature=self.signature, data=payload, location=path)


def fix_of(finding: Finding) -> Fix | None:
    raw = finding.data.get("fix")
    if not raw:
        return None
    edits = tuple(Edit(e["op"], split(e["path"]), e.get("value")) for e in raw.get("edits", []))
    return Fix(raw["description"], raw["safe"], edits)
