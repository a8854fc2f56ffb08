"""The rule table shown by `lossguard rules` and docs/lint.md, built from the registry."""

from __future__ import annotations

from typing import Any

from lossguard.lint.rules import all_rules
from lossguard.lint.rules.base import Rule


def fix_kind(rule: Rule) -> str:
    """safe / unsafe / manual (or a combination), from the fixes the rule's invalid examples produce."""
    from lossguard.lint.api import lint

    kinds: list[str] = []
    for example in rule.examples:
        if example.valid or example.options:
            continue
        for finding in lint(example.config, example.args, example.env, select=[rule.code]):
            fix = finding.data.get("fix")
            kind = "-" if not fix else ("manual" if not fix["applicable"] else "safe" if fix["safe"] else "unsafe")
            if kind not in kinds:
                kinds.append(kind)
    if len(kinds) > 1 and "-" in kinds:
        kinds.remove("-")
    order = {"safe": 0, "unsafe": 1, "manual": 2, "-": 3}
    return "/".join(sorted(kinds, key=order.get)) or "-"


def rule_table() -> list[dict[str, Any]]:
    return [{"code": r.code, "name": r.name, "severity": str(r.severity), "fix": fix_kind(r), "summary": r.summary,
             "evidence": list(r.evidence)} for r in all_rules()]


def rules_markdown(rows: list[dict[str, Any]] | None = None) -> str:
    rows = rows if rows is not None else rule_table()
    out = ["| code | name | severity | fix | summary |", "|---|---|---|---|---|"]
    out += [f"| {r['code']} | `{r['name']}` | {r['severity']} | {r['fix']} | {r['summary'].replace('|', '/')} |"
            for r in rows]
    return "\n".join(out) + "\n"
