"""The banner `watch` prints between the child's lines when the live diagnosis turns bad.

Rendered to a string (rich, colours only when stderr is a terminal) and written by the pump in one
`os.write` at a line boundary, so it is never interleaved into a partial line of the child.
"""

from __future__ import annotations

import io

from rich.console import Console
from rich.text import Text

from lossguard.watch.analyzer import Alert

_STYLE = {"warning": "bold yellow", "broken": "bold red"}
_TOP_CAUSES = 3


def render_banner(alert: Alert, *, color: bool, width: int = 100, halting: str | None = None) -> bytes:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=color, no_color=not color, width=width, highlight=False,
                      soft_wrap=True)
    diagnosis = alert.diagnosis
    style = _STYLE.get(diagnosis.verdict, "bold")
    rule = "=" * min(width, 78)
    console.print(Text(rule, style=style))
    head = Text.assemble((f"lossguard: {diagnosis.verdict.upper()}", style), "  ")
    if diagnosis.signature:
        head.append(diagnosis.signature, style="bold")
        if diagnosis.onset_step is not None:
            head.append(f" since step {diagnosis.onset_step}")
        head.append(f": {diagnosis.summary}")
    else:
        head.append("suspicious findings, no failure signature yet")
    console.print(head)
    where = f"revealed by output line {alert.line_no}"
    if alert.step is not None:
        where += f" (last logged step {alert.step})"
    console.print(Text(where, style="dim"))
    for finding in _top_findings(diagnosis):
        console.print(Text.assemble((f"  {finding.code} ", "bold"), finding.message))
    for i, cause in enumerate(diagnosis.causes[:_TOP_CAUSES], 1):
        console.print(Text.assemble((f"  {i}. ", "bold"), (f"{cause.likelihood:<9}", "cyan"), cause.title))
        console.print(Text.assemble(("     fix: ", "green"), cause.fix))
    if halting:
        console.print(Text(f"lossguard: {halting}", style=style))
    console.print(Text(rule, style=style))
    return buffer.getvalue().encode("utf-8", "replace")


def _top_findings(diagnosis, limit: int = 2):
    relevant = [f for f in diagnosis.findings if f.signature == diagnosis.signature] or diagnosis.findings
    return sorted(relevant, key=lambda f: -f.severity)[:limit]
