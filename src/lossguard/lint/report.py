"""Render lint findings: human text, JSON, SARIF 2.1.0, GitHub Actions annotations.

Findings are data; this module only formats them. No rich import: plain click styling keeps
`lossguard lint` fast.
"""

from __future__ import annotations

import json
from typing import Any

from lossguard.core.findings import Finding, Severity
from lossguard.lint.assumed import versions_line

FORMATS = ("human", "json", "sarif", "github")
_SARIF_LEVEL = {Severity.INFO: "note", Severity.WARNING: "warning", Severity.ERROR: "error", Severity.CRITICAL: "error"}
_GITHUB_LEVEL = {Severity.INFO: "notice", Severity.WARNING: "warning", Severity.ERROR: "error", Severity.CRITICAL: "error"}


def finding_dict(finding: Finding, line: int | None = None) -> dict[str, Any]:
    return {
        "code": finding.code,
        "name": finding.name,
        "severity": str(finding.severity),
        "message": finding.message,
        "path": finding.location or None,
        "line": line,
        "fix": finding.data.get("fix"),
        "evidence": finding.data.get("evidence", []),
        "also": finding.data.get("also", []),  # codes of same-cause findings told inside this one
        "versions": finding.data.get("versions", {}),  # {package: {version, from}} the finding assumed
    }


def assumed_text(finding: Finding) -> str:
    """`DeepSpeed 0.12.6 (--env freeze.txt), torch unknown`: the versions a finding assumed and where from."""
    parts = []
    for dist, seen in (finding.data.get("versions") or {}).items():
        name = "DeepSpeed" if dist == "deepspeed" else dist
        parts.append(f"{name} {seen['version']} ({seen['from']})" if seen.get("version") else f"{name} unknown")
    return ", ".join(parts)


def render(findings: list[Finding], fmt: str, source: str, lines: dict[int, int | None], *, color: bool = False,
           show_info: bool = True, versions: tuple[dict[str, str], str] | None = None) -> str:
    """`lines` maps id(finding) to its line in the config (None when not a config key). `show_info` False:
    the human report lists info findings in one line (machine formats always carry every finding)."""
    if fmt == "json":
        return json.dumps([finding_dict(f, lines.get(id(f))) for f in findings], indent=2) + "\n"
    if fmt == "sarif":
        return json.dumps(_sarif(findings, source, lines, versions), indent=2) + "\n"
    if fmt == "github":
        return "".join(_github(f, source, lines.get(id(f))) + "\n" for f in findings)
    head = versions_line(*versions) + "\n" if versions else ""
    return head + _human(findings, source, lines, color, show_info)


def _human(findings: list[Finding], source: str, lines: dict[int, int | None], color: bool, show_info: bool) -> str:
    import click

    colors = {Severity.INFO: "cyan", Severity.WARNING: "yellow", Severity.ERROR: "red", Severity.CRITICAL: "red"}
    out: list[str] = []
    infos = [f for f in findings if f.severity == Severity.INFO]
    for f in findings if show_info or not infos else [f for f in findings if f.severity > Severity.INFO]:
        line = lines.get(id(f))
        where = f"{source}:{line}" if line else source
        sev = str(f.severity)
        if color:
            sev = click.style(sev, fg=colors[f.severity], bold=f.severity >= Severity.ERROR)
        out.append(f"{where}: {f.code} [{sev}] {f.name}")
        out.append(f"    {f.message}")
        fix = f.data.get("fix")
        if fix:
            kind = ("safe" if fix["safe"] else "unsafe") if fix.get("applicable") else "manual"
            flag = {"safe": " (--fix)", "unsafe": " (--unsafe-fixes)"}.get(kind, "")
            out.append(f"    fix [{kind}]{flag}: {fix['description']}")
        if f.data.get("versions"):
            out.append(f"    assumed: {assumed_text(f)}")
        evidence = f.data.get("evidence") or []
        if evidence:
            out.append(f"    see {evidence[0]}")
    if infos and not show_info:
        codes = ", ".join(sorted({f.code for f in infos}))
        out.append(f"{source}: {len(infos)} info finding{'s' if len(infos) != 1 else ''} ({codes}); "
                   "--show info lists them")
    out.append(summary(findings))
    return "\n".join(out) + "\n"


def summary(findings: list[Finding]) -> str:
    if not findings:
        return "no findings"
    counts: dict[str, int] = {}
    for f in findings:
        counts[str(f.severity)] = counts.get(str(f.severity), 0) + 1
    parts = ", ".join(f"{n} {sev}" for sev, n in sorted(counts.items(), key=lambda kv: -int(Severity.parse(kv[0]))))
    safe = sum(1 for f in findings if (f.data.get("fix") or {}).get("applicable") and f.data["fix"]["safe"])
    unsafe = sum(1 for f in findings if (f.data.get("fix") or {}).get("applicable") and not f.data["fix"]["safe"])
    tail = ""
    if safe or unsafe:
        tail = f"; {safe} fixable with --fix" + (f", {unsafe} more with --unsafe-fixes" if unsafe else "")
    return f"{len(findings)} finding{'s' if len(findings) != 1 else ''} ({parts}){tail}"


def _github(f: Finding, source: str, line: int | None) -> str:
    def esc(text: str) -> str:
        return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")

    props = f"file={esc(source).replace(',', '%2C').replace(':', '%3A')}"
    if line:
        props += f",line={line}"
    props += f",title={f.code} {f.name}"
    assumed = f" [assumed {assumed_text(f)}]" if f.data.get("versions") else ""
    return f"::{_GITHUB_LEVEL[f.severity]} {props}::{esc(f.message + assumed)}"


def _sarif(findings: list[Finding], source: str, lines: dict[int, int | None],
           versions: tuple[dict[str, str], str] | None) -> dict[str, Any]:
    from lossguard import __version__
    from lossguard.lint.rules import get_rule

    rule_ids = sorted({f.code for f in findings})
    rules = []
    for code in rule_ids:
        rule = get_rule(code)
        rules.append({
            "id": code,
            "name": rule.name if rule else code,
            "shortDescription": {"text": rule.summary if rule else code},
            "fullDescription": {"text": rule.doc() if rule else code},
            "defaultConfiguration": {"level": _SARIF_LEVEL[rule.severity] if rule else "warning"},
        })
        if rule and rule.evidence:
            rules[-1]["helpUri"] = rule.evidence[0]
    results = []
    for f in findings:
        location: dict[str, Any] = {"artifactLocation": {"uri": source}}
        if lines.get(id(f)):
            location["region"] = {"startLine": lines[id(f)]}
        result: dict[str, Any] = {
            "ruleId": f.code,
            "ruleIndex": rule_ids.index(f.code),
            "level": _SARIF_LEVEL[f.severity],
            "message": {"text": f.message},
            "locations": [{"physicalLocation": location}],
        }
        props = {"path": f.location} if f.location else {}
        if f.data.get("versions"):
            props["versions"] = f.data["versions"]
        if props:
            result["properties"] = props
        results.append(result)
    return {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{"tool": {"driver": {"name": "lossguard", "version": __version__,
                                      "informationUri": "https://github.com/lossguard/lossguard", "rules": rules}},
                  "results": results,
                  "properties": {"versions": _run_versions(versions)}}],
    }


def _run_versions(versions: tuple[dict[str, str], str] | None) -> dict[str, Any]:
    from lossguard.lint.assumed import PACKAGES

    if versions is None:
        return {}
    found, origin = versions
    return {d: {"version": found.get(d), "from": origin if found.get(d) else "unknown"} for d in PACKAGES}
