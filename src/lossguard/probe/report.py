"""Probe's report: terminal summary, `report.json`, and `report.html` with one line per arm."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ARM_HEADER = ("arm", "changes", "verdict", "signature", "onset", "last step", "first disagreement",
              "max |Δloss|", "note")


def arm_rows(result: Any) -> list[list[Any]]:
    rows = []
    for o in result.comparison.outcomes:
        changes = ", ".join(f"{k}={json.dumps(v)}" for k, v in o.arm.changes.items()) or "-"
        rows.append([o.arm.name, changes, o.verdict, o.signature or "-", _dash(o.onset_step), _dash(o.last_step),
                     _dash(o.first_disagreement),
                     "-" if o.max_abs_dloss is None else f"{o.max_abs_dloss:.3g}", o.note or "-"])
    return rows


def _dash(value: Any) -> Any:
    return "-" if value is None else value


def render_terminal(result: Any, console: Any) -> None:
    """One line per arm (readable in a CI log too), then the verdict line and where things are."""
    width = max(len(o.arm.name) for o in result.comparison.outcomes)
    for o in result.comparison.outcomes:
        style = "red" if o.dies else "green"
        how = "" if o.signature is None else f" {o.signature} at step {o.onset_step}"
        agree = ""
        if not o.arm.is_baseline:
            agree = ("  agrees with baseline" if o.first_disagreement is None
                     else f"  departs from baseline at step {o.first_disagreement}")
            if o.max_abs_dloss is not None:
                agree += f" (max |Δloss| {o.max_abs_dloss:.2g})"
        console.print(f"[{style}]{o.arm.name:<{width}}  {o.verdict:<8}[/{style}]{how}  steps {o.last_step}{agree}",
                      soft_wrap=True)
        if o.note:
            console.print(f"[dim]{'':<{width}}  {o.note}[/dim]", soft_wrap=True)
    console.print(f"[bold]{result.comparison.verdict_line}[/bold]", soft_wrap=True)
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
    markers = [(f"onset ({o.arm.name})", o.onset_step) for o in outcomes if o.dies and o.onset_step is not None]
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
