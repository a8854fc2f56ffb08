"""The "around the onset" table shows the steps around the diagnosis's onset, in step order, even when the
engine's first warning came far earlier (issue #24: headline "since step 323", rows 46-57)."""

import math

from lossguard.api import analyze
from lossguard.report.timeline import onset_rows


def _log(tmp_path):
    lines = []
    for step in range(1, 400):
        if step == 46:
            loss, grad = 40.0, 90.0  # an isolated spike: a warning long before the death
        elif step >= 323:
            loss, grad = 0.0, math.nan
        else:
            loss, grad = 2.0 - step / 1000, 1.0 + (step % 7) / 10
        lines.append(f"{{'loss': {loss}, 'grad_norm': {grad}, 'learning_rate': 2e-05, 'epoch': {step / 400:.3f}}}")
        lines.append(f" {step}/400 [00:01<00:10, 10.00it/s]")
    path = tmp_path / "train.log"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_rows_are_around_the_onset_in_step_order(tmp_path):
    diagnosis = analyze([str(_log(tmp_path))])
    assert diagnosis.verdict == "broken" and diagnosis.onset_step is not None
    assert any(f.step is not None and f.step < 60 for f in diagnosis.findings)  # the early warning is there
    steps = [r.step for r in onset_rows(diagnosis)]
    onset = diagnosis.onset_step
    assert onset in steps and steps == sorted(steps)
    assert all(onset - 5 <= s <= onset + 6 for s in steps), (onset, steps)


def test_the_terminal_and_html_reports_show_those_rows(tmp_path):
    import io
    import re

    from rich.console import Console

    from lossguard.report.html import diagnosis_html
    from lossguard.report.terminal import render

    diagnosis = analyze([str(_log(tmp_path))])
    out = io.StringIO()
    render(diagnosis, Console(file=out, width=150, color_system=None))
    table = out.getvalue().split("around the onset", 1)[1].split("causes, ranked", 1)[0]
    steps = [int(m) for m in re.findall(r"^\s*(\d+) │", table, re.M)]
    onset = diagnosis.onset_step
    assert onset in steps and all(onset - 5 <= s <= onset + 6 for s in steps), (onset, steps)
    html = diagnosis_html(diagnosis) if callable(diagnosis_html) else ""
    assert html and f">{onset - 20}<" not in html.split("Around the onset", 1)[-1].split("</table>", 1)[0]
