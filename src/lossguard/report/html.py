"""Self-contained HTML report: one file, inline CSS/JS/SVG, opens offline and makes no request.

`render_html(...)` is the page from plain parts (named series per signal, causes, findings, facts), so
`analyze`, `watch`, `probe` and `demo` share it: probe passes one line per arm. `write_html(diagnosis, path)`
is the report of a diagnosis. Every string that can come from a log, a config or a caller is escaped;
the plot data embedded for the hover script is JSON with `<`, `>`, `&` written as \\u003c etc.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any

from lossguard.core.findings import Finding
from lossguard.diagnose.diagnosis import sample_names
from lossguard.diagnose.ranking import Cause
from lossguard.report import html_assets
from lossguard.report import html_sections as sections
from lossguard.report.html_sections import PANELS, Series, Table
from lossguard.report.svg import Point
from lossguard.report.timeline import onset_rows

# The file name `watch`, `probe` and `demo` write under their `--report DIR`.
REPORT_FILENAME = "report.html"


def render_html(
    *,
    series: Series,
    title: str = "lossguard report",
    verdict: str | None = None,
    signature: str | None = None,
    headline: str = "",
    summary: Sequence[str] = (),
    markers: Sequence[tuple[str, int]] = (),
    causes: Sequence[Cause] = (),
    findings: Sequence[Finding] = (),
    facts: Mapping[str, Any] | None = None,
    facts_origin: Mapping[str, str] | None = None,
    tables: Sequence[Table] = (),
    inputs: Sequence[str] = (),
    num_suppressed: int = 0,
) -> str:
    """The whole page as a string.

    `series` is `{signal: {line name: [(step, value), ...]}}`, e.g. `{"loss": {"rank0": [...], "rank1": [...]}}`
    or one line per probe arm; NaN/Inf values are kept and drawn as markers. `markers` are labelled vertical
    lines, e.g. `[("onset", 61234)]`.
    """
    plots_html, plot_data = sections.plots_html(series, markers)
    body = [
        sections.banner_html(verdict, signature, headline),
        "".join(f'<p class="summary">{escape(line)}</p>' for line in summary),
        '<h2 id="plots">Signals over steps</h2>' + (plots_html or '<p class="note">No numeric signals were logged.</p>'),
        sections.causes_html(causes),
        "".join(sections.table_html(t) for t in tables),
        sections.findings_html(findings, num_suppressed),
        sections.run_html(facts or {}, facts_origin or {}, inputs),
        f'<footer>lossguard {escape(_version())} &middot; a self-contained report: no request leaves this page.'
        "</footer>",
    ]
    return "".join([
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
        f'<meta http-equiv="Content-Security-Policy" content="{escape(html_assets.content_security_policy())}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{escape(title)}</title><style>{html_assets.CSS}</style></head><body><main>",
        *body,
        "</main>",
        f'<script type="application/json" id="lossguard-data">{script_json({"plots": plot_data})}</script>',
        f"<script>{html_assets.JS}</script></body></html>\n",
    ])


def diagnosis_html(diagnosis, *, title: str | None = None, series: Series | None = None,
                   markers: Sequence[tuple[str, int]] | None = None, tables: Sequence[Table] = ()) -> str:
    """The report of a `Diagnosis`. `series` replaces the run's own (probe: one line per arm, see
    `merge_series`); `markers` replaces the onset marker; `tables` are added after the causes."""
    result = diagnosis.result
    if markers is None:
        markers = [("onset", diagnosis.onset_step)] if diagnosis.onset_step is not None else []
        markers = [*markers, *(("held", r["step"]) for r in diagnosis.recoveries)]
    window = _onset_table(diagnosis)
    recovered = _recovered_table(diagnosis)
    return render_html(
        series=series if series is not None else result.series.to_dict(),
        title=title or _default_title(diagnosis),
        verdict=diagnosis.verdict,
        signature=diagnosis.signature,
        headline=_headline(diagnosis),
        summary=_summary(diagnosis),
        markers=markers,
        causes=diagnosis.causes if diagnosis.verdict != "healthy" else [],
        findings=diagnosis.findings,
        facts=result.facts.known(),
        facts_origin=result.facts.origin,
        tables=([recovered] if recovered else []) + ([window] if window else []) + list(tables),
        inputs=diagnosis.inputs,
        num_suppressed=result.num_suppressed,
    )


def write_html(diagnosis, path: str | Path, *, title: str | None = None, series: Series | None = None,
               markers: Sequence[tuple[str, int]] | None = None, tables: Sequence[Table] = ()) -> Path:
    """Write the report of `diagnosis` to `path` (parent directories are created). Returns the path.

    Commands with `--report DIR` write `DIR / REPORT_FILENAME`.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    page = diagnosis_html(diagnosis, title=title, series=series, markers=markers, tables=tables)
    path.write_text(page, encoding="utf-8")
    return path


def merge_series(named: Mapping[str, Series]) -> dict[str, dict[str, list[Point]]]:
    """Several runs' series on the same plots, e.g. probe's arms: `{"baseline": book.to_dict(), ...}`.

    A run's single run-level line takes the run's name; rank lines become `"NAME rank0"`.
    """
    out: dict[str, dict[str, list[Point]]] = {}
    for run_name, series in named.items():
        for signal, lines in series.items():
            only_all = list(lines) == ["all"]
            for line_name, points in lines.items():
                label = run_name if only_all else f"{run_name} {line_name}"
                out.setdefault(signal, {})[label] = list(points)
    return out


def script_json(value: Any) -> str:
    """JSON safe inside `<script>`: no `</script>`, no `<!--`, no HTML entity, no JS line separators."""
    text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    for char, code in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                       ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(char, code)
    return text


# -- from a diagnosis ---------------------------------------------------------------------------------------
def _default_title(diagnosis) -> str:
    what = diagnosis.signature or diagnosis.verdict
    return f"lossguard: {what}"


def _headline(diagnosis) -> str:
    if diagnosis.signature is None:
        return f"no failure signature in {diagnosis.result.stats.num_train} training logs"
    since = ""
    if diagnosis.onset_step is not None:
        ordinal = " (log #: the log has no step numbers)" if diagnosis.result.stats.steps_are_ordinal else ""
        since = f" since step {diagnosis.onset_step}{ordinal}"
    return f"{since.strip()}: {diagnosis.summary}" if since else diagnosis.summary


def _summary(diagnosis) -> list[str]:
    stats = diagnosis.result.stats
    line = f"{stats.num_train:,} training logs, {stats.num_eval:,} eval logs"
    if stats.first_step is not None:
        line += f", steps {stats.first_step} to {stats.last_step}"
    if stats.ranks:
        line += f", ranks {', '.join(str(r) for r in sorted(stats.ranks))}"
    events = {k: v for k, v in stats.events.items() if k != "facts"}
    out = [line]
    if events:
        out.append("log events: " + ", ".join(f"{name} x{count}" for name, count in sorted(events.items())))
    return out


def _onset_table(diagnosis) -> Table | None:
    window = onset_rows(diagnosis)
    if not window or diagnosis.signature is None:
        return None
    signals = [s for s in PANELS if any(s in r.signals for r in window)]
    ranked = any(r.rank is not None for r in window)
    has_events = any(r.event for r in window)
    header = ["step"] + (["rank"] if ranked else []) + signals + (["event"] if has_events else []) + ["where"]
    rows, highlight = [], set()
    for i, record in enumerate(window):
        if record.step is not None and record.step == diagnosis.onset_step:
            highlight.add(i)
        row: list[Any] = [record.step]
        if ranked:
            row.append(record.rank)
        row += [record.signals.get(s) for s in signals]
        row += ([record.event or ""] if has_events else []) + [record.where]
        rows.append(row)
    return Table("Around the onset", header, rows, highlight=highlight,
                 note=f"The first step of {diagnosis.signature} is highlighted.")


def _recovered_table(diagnosis) -> Table | None:
    """The steps the live guard recovered in place (a recovered run must not read as if nothing happened)."""
    if not diagnosis.recoveries:
        return None
    rows = [[r["step"], ", ".join(map(str, r["ranks"])), r["kind"], r["signature"], r["code"], r["steps_lost"],
             sample_names(r["samples"]), r["action"]] for r in diagnosis.recoveries]
    return Table("Recovered", ["step", "ranks", "kind", "signature", "code", "steps lost", "samples", "action"],
                 rows, note="Steps the live guard (recover=True) held, replayed or recomputed on every rank "
                            "instead of applying as they came; each is marked 'held' on the plots.")


def _version() -> str:
    from lossguard import __version__

    return __version__


__all__ = ["PANELS", "REPORT_FILENAME", "Series", "Table", "diagnosis_html", "merge_series", "render_html",
           "script_json", "write_html"]
