"""The lint API: `lint(config, training_args, env) -> findings`, `load_config(path)`, and the fix loop.

The CLI is a thin shell over these functions; other commands (`analyze --config`, `probe`) reuse
`routes.open_route` (the config behind any route) and `lint`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lossguard.core.findings import Finding
from lossguard.lint.args import load_args_file, normalize
from lossguard.lint.context import LintContext
from lossguard.lint.document import ConfigError, Document, load_config, read_document
from lossguard.lint.env import installed_versions, versions_from_file
from lossguard.lint.fsdp import FsdpView, from_args, read_view
from lossguard.lint.routes import recognised_keys
from lossguard.lint.rules import select_rules
from lossguard.lint.rules.base import Edit, fix_of

__all__ = ["ConfigError", "FixResult", "fix_document", "lint", "lint_context", "load_config", "read_document"]


def _versions(env: dict[str, str] | str | None) -> dict[str, str]:
    if env is None:
        return installed_versions()
    if isinstance(env, str):
        return versions_from_file(env)
    return {str(k).lower().replace("_", "-"): str(v) for k, v in env.items()}


def _args(training_args: dict[str, Any] | str | None) -> dict[str, Any] | None:
    if training_args is None:
        return None
    if isinstance(training_args, str):
        return load_args_file(training_args)
    if "origin" in training_args and "framework" in training_args:
        return dict(training_args)  # already normalized
    return normalize(training_args, "training arguments")


def lint_context(config: dict[str, Any], training_args: dict[str, Any] | str | None = None,
                 env: dict[str, str] | str | None = None, *, source: str = "<config>",
                 options: dict[str, Any] | None = None) -> LintContext:
    """Raises ConfigError when FSDP keys hold values of the wrong type (the message names the key)."""
    args = _args(training_args)
    return LintContext(raw=config, args=args, versions=_versions(env), source=source, options=dict(options or {}),
                       fsdp=fsdp_view(config, args, source))


def fsdp_view(config: Any, args: dict[str, Any] | None, source: str = "<config>") -> FsdpView | None:
    """The FSDP setup of the config (an accelerate / Trainer / training YAML / torchtitan ... file), else the
    Trainer's `--fsdp` arguments when no DeepSpeed config is given; None for a DeepSpeed run."""
    view = read_view(config, source) if isinstance(config, dict) else None
    if view is None and not (isinstance(config, dict) and recognised_keys(config)):
        view = from_args(args)
    return view


def run_rules(ctx: LintContext, select: list[str] | None = None, ignore: list[str] | None = None) -> list[Finding]:
    from lossguard.lint.assumed import other_versions, stamp

    findings: list[Finding] = []
    for rule in select_rules(select, ignore):
        if ctx.engine not in rule.engines:
            continue
        ctx.read.clear()
        found = list(rule.check(ctx))
        read = set(ctx.read)
        if not found and rule.issues and ctx.options.get("other_versions"):  # the CLI asks for it
            extra = other_versions(rule, ctx, read)
            found = [extra] if extra else []
        stamp(found, ctx, read)
        findings.extend(found)
    findings.sort(key=lambda f: (-int(f.severity), f.code, f.location or ""))
    return fold_root_causes(findings)


def fold_root_causes(findings: list[Finding]) -> list[Finding]:
    """One finding per root cause: a finding whose rule names a `root_cause` that fired too is told inside
    that finding (its message and code in `data["also"]`), not printed as a second error with its own fix."""
    from lossguard.lint.rules import RULES

    causes = {rule.code: rule.root_cause for rule in RULES if rule.root_cause}
    hosts = {f.code: f for f in findings}
    kept: list[Finding] = []
    for finding in findings:
        host = hosts.get(causes.get(finding.code, ""))
        if host is None:
            kept.append(finding)
            continue
        host.data.setdefault("also", []).append(finding.code)
        host.severity = max(host.severity, finding.severity)
        host.message += f". Same cause: {finding.code} {finding.name} ({finding.message})"
    return kept


def lint(config: dict[str, Any] | str, training_args: dict[str, Any] | str | None = None,
         env: dict[str, str] | str | None = None, *, select: list[str] | None = None,
         ignore: list[str] | None = None, options: dict[str, Any] | None = None) -> list[Finding]:
    """Findings for a DeepSpeed config (a dict or a path), training arguments (a dict, a normalized dict
    from `lossguard.lint.args`, or a JSON/YAML path) and versions (a dict, a `pip freeze` file, or None
    for the installed packages). `Finding.location` is the dotted config key; `data["fix"]` the fix."""
    source = "<config>"
    if isinstance(config, str):
        source = config
        config, _ = load_config(config)
    ctx = lint_context(config, training_args, env, source=source, options=options)
    return run_rules(ctx, select, ignore)


@dataclass
class FixResult:
    text: str
    data: dict[str, Any]
    applied: list[Finding] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def fixable(finding: Finding, unsafe: bool) -> bool:
    fix = fix_of(finding)
    return bool(fix and fix.edits and (fix.safe or unsafe))


def fix_document(doc: Document, ctx_kwargs: dict[str, Any], *, unsafe: bool = False,
                 select: list[str] | None = None, ignore: list[str] | None = None, max_rounds: int = 5) -> FixResult:
    """Apply fixes until none applies (a fix can enable another, e.g. overlap off → no bucket finding)."""
    from lossguard.lint.fix import apply_to_dict, apply_to_text

    result = FixResult(text=doc.text, data=doc.data)
    current = doc
    for _ in range(max_rounds):
        ctx = lint_context(current.data, source=doc.source, **ctx_kwargs)
        todo = [f for f in run_rules(ctx, select, ignore) if fixable(f, unsafe)]
        safe = [f for f in todo if fix_of(f).safe]
        todo = safe or todo  # unsafe fixes wait until no safe fix is left: a safe one may remove their reason
        edits: list[Edit] = []
        for finding in todo:
            candidate = edits + list(fix_of(finding).edits)
            if apply_to_dict(current.data, candidate) != apply_to_dict(current.data, edits):
                edits = candidate
                result.applied.append(finding)
        if not edits:
            break
        text, warnings = apply_to_text(current, edits)
        result.warnings.extend(warnings)
        current = _reparse(text, current)
    result.text, result.data = current.text, current.data
    return result


def _reparse(text: str, doc: Document) -> Document:
    from lossguard.lint.document import parse_text

    new = parse_text(text, doc.source, doc.fmt)
    new.warnings = []
    return new
