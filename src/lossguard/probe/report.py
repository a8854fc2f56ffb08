"""Probe's report: terminal summary, `report.json`, and `report.html` with one line per arm."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ARM_HEADER = ("arm", "changes", "verdict", "runs died", "signature", "onset", "last step",
              "against baseline", "max |Δloss|", "note")


def arm_rows(result: Any) -> list[list[Any]]:
    rows = []
    for o in result.comparison.outcomes:
        changes = ", ".join(f"{k}={json.dumps(v)}" for k, v in o.arm.changes.items()) or "-"
        rows.append([o.arm.name, changes, o.verdict, f"{o.num_deaths}/{len(o.runs)}", o.signature or "-",
                     _dash(o.onset_step), _dash(o.last_step), against_baseline(o, result.comparison.outcomes[0]),
                     "-" if o.max_abs_dloss is None else f"{o.max_abs_dloss:.3g}", o.note or "-"])
    return rows


def against_baseline(o: Any, base: Any) -> str:
    """`agrees with baseline` only for an arm with the baseline's fate and its numbers within tolerance."""
    if o is base:
        return "-"
    if o.verdict != base.verdict:
        text = f"fate differs from baseline (baseline {base.verdict}, this arm {o.verdict})"
        if o.first_disagreement is not None:
            text += f"; departs at step {o.first_disagreement}"
        elif o.max_abs_dloss is not None:
            text += "; same losses within tolerance where both logged"
        return text
    if o.agrees:
        return "agrees with baseline"
    return f"departs from baseline at step {o.first_disagreement}"


def _dash(value: Any) -> Any:
    return "-" if value is None else value


def render_terminal(result: Any, console: Any) -> None:
    """One line per arm (readable in a CI log too), then the verdict line and where things are."""
    from rich.markup import escape

    outcomes = result.comparison.outcomes
    width = max(len(o.arm.name) for o in outcomes)
    for o in outcomes:
        style = "green" if o.verdict == "survives" else "yellow" if o.verdict == "unstable" else "red"
        how = "" if o.signature is None else f" {o.signature} at step {o.onset_step}"
        runs = f"  died {o.num_deaths} of {len(o.runs)} runs" if len(o.runs) > 1 else ""
        agree = ""
        if o is not outcomes[0]:
            agree = "  " + against_baseline(o, outcomes[0])
            if o.max_abs_dloss is not None:
                agree += f" (max |Δloss| {o.max_abs_dloss:.2g})"
        console.print(f"[{style}]{escape(f'{o.arm.name:<{width}}')}  {o.verdict:<8}[/{style}]{how}  "
                      f"steps {o.last_step}{runs}{escape(agree)}", soft_wrap=True)
        if o.note:
            console.print(f"[dim]{'':<{width}}  {escape(o.note)}[/dim]", soft_wrap=True)
    console.print(f"[bold]{escape(result.comparison.verdict_line)}[/bold]", soft_wrap=True)
    if result.recommended_path is not None:
        console.print(f"recommended config: {result.recommended_path}", soft_wrap=True)
    console.print(f"[dim]arms, logs and events: {result.work_dir / 'arms'}; tolerance |Δloss| <= "
                  f"{result.comparison.atol:g} + {result.comparison.rtol:g}·|loss|[/dim]", soft_wrap=True)


def write_reports(result: Any, report_dir: Path) -> list[Path]:
    from lossguard.report.html import REPORT_FILENAME, Table, merge_series, write_html

    report_dir.mkdir(parents=True, exist_ok=True)
    json_path = report_dir / "report.json"
    payload = result.to_dict()
    for arm, outcome in zip(payload["arms"], result.comparison.outcomes):
        arm["dir"] = str(outcome.run.dir)
        arm["loss"] = [[s, _num(v)] for s, v in outcome.loss.items()]
        arm["grad_norm"] = [[s, _num(v)] for s, v in outcome.grad_norm.items()]
    json_path.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    paths = [json_path]
    outcomes = result.comparison.outcomes
    lead = next((o for o in outcomes if o.diagnosis is not None), None)
    if lead is None:
        return paths
    series = merge_series({o.arm.name: {"loss": _points(o.loss), "grad_norm": _points(o.grad_norm)}
                           for o in outcomes})
    markers = [(f"onset ({o.arm.name})", o.onset_step) for o in outcomes
               if o.verdict != "survives" and o.onset_step is not None]
    table = Table("Probe arms", ARM_HEADER, arm_rows(result), note=result.comparison.verdict_line,
                  highlight={i for i, o in enumerate(outcomes) if o is result.comparison.recommended})
    paths.append(write_html(lead.diagnosis, report_dir / REPORT_FILENAME,
                            title=f"lossguard probe: {result.config_path.name}", series=series,
                            markers=markers, tables=[table]))
    return paths


def _points(trajectory: dict[int, float]) -> dict[str, list[tuple[int, float]]]:
    return {"all": list(trajectory.items())}


def _num(value: float) -> Any:
    import math

    return value if math.isfinite(value) else str(value)
