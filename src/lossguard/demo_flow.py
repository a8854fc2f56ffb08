"""The demo's five acts, printed for a person: run and catch, diagnose, fix, recover in place, report."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.rule import Rule
from rich.text import Text

from lossguard.api import analyze
from lossguard.demo import Demo, deep_merge, halted_step, run_arm
from lossguard.probe.scenarios import get as get_scenario
from lossguard.report.html import REPORT_FILENAME, merge_series, write_html
from lossguard.report.terminal import render


def run_demo(demo: Demo, out: Path) -> int:
    console = Console(highlight=False)
    scenario = get_scenario(demo.scenario)
    console.print(Rule("lossguard demo"))
    console.print(f"scenario [bold]{scenario.name}[/]: {scenario.description}")
    console.print(f"everything goes to {out}\n")

    console.print(Text("1/5  the run, with lossguard's Trainer callback on both ranks (halt_on=broken)", style="bold"))
    dying = run_arm("dying", scenario.name, out / "dying", console, ds_config=None)
    stopped = halted_step(dying)
    if stopped is not None:
        console.print(Text(f"    lossguard stopped the job at step {stopped} on every rank (exit code "
                           f"{dying.returncode}); checkpoint: {out / 'dying'}/checkpoint-{stopped}",
                           style="bold yellow"))
    else:
        console.print(Text(f"    the job ended with exit code {dying.returncode} and was not halted", style="yellow"))

    console.print(Text(f"\n2/5  lossguard analyze {out / 'dying'}", style="bold"))
    diagnosis = analyze([out / "dying"])
    render(diagnosis, console, max_findings=6)

    console.print(Text(f"\n3/5  the fix: {demo.fix_label}", style="bold"))
    if demo.fix_changes is not None:
        fixed_config = deep_merge(scenario.ds_config, demo.fix_changes)
        fixed = run_arm("fixed", scenario.name, out / "fixed", console, ds_config=fixed_config)
    else:
        fixed = run_arm("fixed", demo.fix_scenario, out / "fixed", console, ds_config=None)
    fixed_diagnosis = analyze([out / "fixed"])
    style = "bold green" if fixed_diagnosis.verdict == "healthy" else "bold red"
    console.print(Text(f"    fixed run: {fixed_diagnosis.verdict.upper()} "
                       f"({fixed_diagnosis.result.stats.num_train} step records, exit code {fixed.returncode})",
                       style=style))

    console.print(Text("\n4/5  the same dying run again, with recover=True on the callback (no other change)",
                       style="bold"))
    recovered = run_arm("recovered", scenario.name, out / "recovered", console, ds_config=None, recover=True)
    recovered_diagnosis = analyze([out / "recovered"])
    finished = recovered.returncode == 0 and recovered.halted_at is None and bool(recovered.recoveries)
    held = ", ".join(f"step {r['step']} ({r['kind']})" for r in recovered.recoveries) or "none"
    console.print(Text(f"    recovered run: {'finished' if finished else 'did not finish'}, verdict "
                       f"{recovered_diagnosis.verdict.upper()} ({recovered_diagnosis.result.stats.num_train} step "
                       f"records, exit code {recovered.returncode}); held: {held}. The report says so (REC001): "
                       f"a repaired run never reads as if nothing happened.", style="bold cyan" if finished else
                       "bold red"))

    console.print(Text("\n5/5  report", style="bold"))
    series = merge_series({"dying": diagnosis.result.series.to_dict(),
                           "fixed": fixed_diagnosis.result.series.to_dict(),
                           "recovered": recovered_diagnosis.result.series.to_dict()})
    report = write_html(diagnosis, out / REPORT_FILENAME, title=f"lossguard demo: {scenario.name}", series=series)
    caught = diagnosis.verdict == "broken" and stopped is not None
    console.print(f"    {report}  (open it in a browser: the dying, fixed and recovered runs side by side)")
    console.print(Rule())
    if caught and fixed_diagnosis.verdict == "healthy" and finished:
        console.print(Text(f"baseline dies at step {diagnosis.onset_step} with {diagnosis.signature}, caught and "
                           f"stopped at step {stopped}; with {demo.fix_label} the same run is healthy; with "
                           f"recover=True it finishes, {held} held and reported.", style="bold green"))
        return 0
    console.print(Text("the demo did not go as expected: see the output above", style="bold red"))
    return 1
