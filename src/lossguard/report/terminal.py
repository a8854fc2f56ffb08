"""Terminal report: the verdict first, then the timeline around the onset, the top causes and fixes."""

from __future__ import annotations

import math

from rich.console import Console
from rich.table import Table
from rich.text import Text

from lossguard.core.findings import Severity
from lossguard.diagnose.diagnosis import Diagnosis, deciding_facts, sample_names
from lossguard.report.timeline import onset_rows

_VERDICT_STYLE = {"healthy": "bold green", "warning": "bold yellow", "broken": "bold red"}
_TIMELINE_SIGNALS = ("loss", "raw_loss", "grad_norm", "lr", "loss_scale", "num_label_tokens", "eval_loss")


def render(diagnosis: Diagnosis, console: Console | None = None, *, max_findings: int = 12) -> None:
    console = console or Console(highlight=False)
    verdict = Text(f" {diagnosis.verdict.upper()} ", style=_VERDICT_STYLE[diagnosis.verdict] + " reverse")
    headline = Text.assemble(verdict, "  ")
    if diagnosis.signature:
        headline.append(diagnosis.signature, style="bold")
        if diagnosis.onset_step is not None:
            ordinal = " (log #, the log has no step numbers)" if diagnosis.result.stats.steps_are_ordinal else ""
            headline.append(f" since step {diagnosis.onset_step}{ordinal}")
        headline.append(f": {diagnosis.summary}")
    else:
        headline.append("no failure signature in ", style="")
        headline.append(f"{diagnosis.result.stats.num_train} training logs")
    console.print(headline)
    _facts(console, diagnosis)
    if diagnosis.signature and diagnosis.verdict != "healthy":
        _timeline(console, diagnosis)
        _causes(console, diagnosis)
    _recovered(console, diagnosis)
    _findings(console, diagnosis, max_findings)


def _recovered(console: Console, diagnosis: Diagnosis) -> None:
    """What the live guard recovered in place: the run finished, but these steps did not go as trained."""
    if not diagnosis.recoveries:
        return
    console.print(Text(f"recovered ({len(diagnosis.recoveries)} step(s) recovered in place by the live guard)",
                       style="bold yellow"))
    for r in diagnosis.recoveries:
        ranks = ", ".join(map(str, r["ranks"])) or "?"
        named = sample_names(r["samples"])
        console.print(Text.assemble((f"  step {r['step']:<7}", "bold"), (f"{r['kind']:<10}", "yellow"),
                                    f"{r['signature']} ({r['code']}) on rank(s) {ranks}; {r['action']}; "
                                    + (f"sample(s) {named}; " if named else "")
                                    + f"{r['steps_lost']} step(s) lost"))


def _facts(console: Console, diagnosis: Diagnosis) -> None:
    facts = diagnosis.result.facts.known()
    if facts:
        text = ", ".join(f"{k}={v}" for k, v in facts.items())
        console.print(Text("run: ", style="dim") + Text(text, style="dim"))


def _fmt(value: float | None) -> str:
    if value is None:
        return ""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return f"{value:.6g}"


def _timeline(console: Console, diagnosis: Diagnosis) -> None:
    window = onset_rows(diagnosis)
    if not window:
        return
    signals = [s for s in _TIMELINE_SIGNALS if any(s in r.signals for r in window)]
    table = Table(title="around the onset", title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("step", justify="right")
    if any(r.rank is not None for r in window):
        table.add_column("rank", justify="right")
    for name in signals:
        table.add_column(name, justify="right")
    table.add_column("event")
    ranked = any(r.rank is not None for r in window)
    for record in window:
        style = "red" if record.step == diagnosis.onset_step else None
        cells = [str(record.step if record.step is not None else "")]
        if ranked:
            cells.append("" if record.rank is None else str(record.rank))
        cells += [_fmt(record.signals.get(name)) for name in signals]
        cells.append(record.event or "")
        table.add_row(*cells, style=style)
    console.print(table)


def _causes(console: Console, diagnosis: Diagnosis) -> None:
    if not diagnosis.causes:
        return
    console.print(Text("causes, ranked", style="bold"))
    for i, cause in enumerate(diagnosis.causes, 1):
        console.print(Text.assemble((f" {i}. ", "bold"), (f"{cause.likelihood:<9}", "cyan"), cause.title))
        for line in cause.evidence:
            console.print(Text(f"      evidence: {line}", style="dim"))
        for line in cause.against:
            console.print(Text(f"      against: {line}", style="dim"))
        console.print(Text.assemble(("      fix: ", "green"), cause.fix))
        if i == 1 and cause.confirm:
            console.print(Text.assemble(("      confirm: ", "dim"), cause.confirm))
        if i == 1 and cause.links:
            console.print(Text("      documented in: " + " ".join(cause.links[:3]), style="dim"))
    deciding = deciding_facts(diagnosis.causes)
    if deciding:
        console.print(Text("the inputs do not show what would decide between these causes; supply:", style="bold"))
        for line in deciding:
            console.print(Text(f"  - {line}"))


def _findings(console: Console, diagnosis: Diagnosis, limit: int) -> None:
    shown = [f for f in diagnosis.findings if f.severity >= Severity.INFO][:limit]
    if not shown:
        return
    console.print(Text("findings", style="bold"))
    for finding in shown:
        where = f"step {finding.step}" if finding.step is not None else "run"
        if finding.rank is not None:
            where += f", rank {finding.rank}"
        console.print(Text.assemble(
            (f"  {finding.code:<9}", "bold"), (f"{str(finding.severity):<9}", _sev_style(finding.severity)),
            (f"{where}: ", "dim"), finding.message))
    hidden = len(diagnosis.findings) - len(shown)
    if hidden > 0:
        console.print(Text(f"  ... {hidden} more (use --format json)", style="dim"))


def _sev_style(severity: Severity) -> str:
    return {Severity.INFO: "dim", Severity.WARNING: "yellow", Severity.ERROR: "red",
            Severity.CRITICAL: "bold red"}[severity]
