"""Self-contained HTML report: one file, inline CSS/JS/SVG, opens offline and makes no request.

`render_html(...)` is the page from plain parts (named series per signal, causes, findings, facts), so
`analyze`, `watch`, `probe` and `demo` share it: probe passes one line per arm. `write_html(diagnosis, path)`
is the report of a diagnosis. Every string that can come from a log, a config or a caller is escaped;
the plot data embedded for the hover script is JSON with `<`, `>`, `&` written as \\u003c etc.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any

from lossguard.core.findings import Finding
from lossguard.core.records import EVENT
from lossguard.diagnose.ranking import Cause
from lossguard.report import html_assets
from lossguard.report.svg import (
    MAX_POINTS_PER_PAGE,
    MAX_POINTS_PER_PLOT,
    Point,
    fmt_value,
    make_plot,
    render_svg,
    x_range_of,
)

# signal -> (panel title, log scale allowed). Order is the page's order; other signals follow.
PANELS: dict[str, tuple[str, bool]] = {
    "loss": ("loss", False),
    "raw_loss": ("raw loss (before the Trainer's NaN filter)", False),
    "eval_loss": ("eval loss", False),
    "grad_norm": ("grad norm", True),
    "grad_norm_unclipped": ("grad norm before clipping", True),
    "lr": ("learning rate", False),
    "loss_scale": ("loss scale", True),
    "num_label_tokens": ("supervised tokens", False),
    "min_label_tokens": ("fewest supervised tokens in a micro-batch", False),
    "skipped_steps": ("skipped steps (cumulative)", False),
    "update_ratio": ("update / weight ratio", True),
    "step_time_s": ("step time (s)", False),
    "param_fingerprint": ("weight fingerprint", False),
}
_NOT_PLOTTED = {"epoch"}
# The file name `watch`, `probe` and `demo` write under their `--report DIR`.
REPORT_FILENAME = "report.html"
_MAX_FINDING_ROWS = 300
_VERDICTS = ("healthy", "warning", "broken")

Series = Mapping[str, Mapping[str, Sequence[Point]]]


@dataclass(slots=True)
class Table:
    """An extra section: probe's arm comparison, the timeline around the onset, ..."""

    title: str
    header: Sequence[str]
    rows: Sequence[Sequence[Any]]
    note: str = ""
    highlight: set[int] = field(default_factory=set)  # row indexes drawn as the onset


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
    plots_html, plot_data = _plots(series, markers)
    body = [
        _banner(verdict, signature, headline),
        "".join(f'<p class="summary">{escape(line)}</p>' for line in summary),
        '<h2 id="plots">Signals over steps</h2>' + (plots_html or '<p class="note">No numeric signals were logged.</p>'),
        _causes(causes),
        "".join(_table(t) for t in tables),
        _findings(findings, num_suppressed),
        _run(facts or {}, facts_origin or {}, inputs),
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
    window = _onset_table(diagnosis)
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
        tables=([window] if window else []) + list(tables),
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


# -- sections -----------------------------------------------------------------------------------------------
def _banner(verdict: str | None, signature: str | None, headline: str) -> str:
    kind = verdict if verdict in _VERDICTS else "unknown"
    label = (verdict or "report").upper()
    sig = f'<span class="sig">{escape(signature)}</span>' if signature else ""
    return (f'<header class="banner {kind}" id="verdict"><span class="verdict">{escape(label)}</span>{sig}'
            f'<div class="headline">{escape(headline)}</div></header>')


def _plots(series: Series, markers: Sequence[tuple[str, int]]) -> tuple[str, dict]:
    x_range = x_range_of(series)
    order = [s for s in PANELS if s in series] + sorted(s for s in series if s not in PANELS and s not in _NOT_PLOTTED)
    html_parts, data = [], {}
    per_plot = min(MAX_POINTS_PER_PLOT, MAX_POINTS_PER_PAGE // max(1, len(order)))
    for i, signal in enumerate(order):
        lines = {name: points for name, points in series[signal].items() if points}
        if not lines:
            continue
        title, log_ok = PANELS.get(signal, (signal, False))
        plot = make_plot(signal, title, lines, x_range, markers=markers, log_allowed=log_ok,
                         max_points=per_plot)
        plot_id = f"plot-{i}"
        data[plot_id] = plot.to_data()
        html_parts.append(f'<figure class="plot" id="fig-{escape(signal)}" data-signal="{escape(signal)}">'
                          f"{_legend(plot)}{render_svg(plot, plot_id)}</figure>")
    return "".join(html_parts), data


def _legend(plot) -> str:
    if len(plot.lines) == 1 and plot.lines[0].name == "all":
        return ""
    keys = "".join(f'<span class="key"><i style="background:{line.color}"></i>{escape(line.name)}</span>'
                   for line in plot.lines)
    return f'<div class="legend">{keys}</div>'


def _causes(causes: Sequence[Cause]) -> str:
    if not causes:
        return ""
    items = []
    for cause in causes:
        pct = max(0.0, min(1.0, cause.confidence)) * 100
        evidence = "".join(f"<li>{escape(line)}</li>" for line in cause.evidence)
        links = " ".join(_link(url) for url in cause.links)
        items.append(
            f'<li class="cause" id="cause-{escape(cause.id)}"><div><span class="conf">{pct:.0f}%</span>'
            f'<span class="bar"><span style="width:{pct:.1f}%"></span></span>'
            f'<span class="cause-title">{escape(cause.title)}</span> <code>{escape(cause.id)}</code></div>'
            + (f'<ul class="evidence">{evidence}</ul>' if evidence else "")
            + (f'<div class="fix"><b>Fix:</b> {escape(cause.fix)}</div>' if cause.fix else "")
            + (f'<div class="confirm"><b>Confirm:</b> {escape(cause.confirm)}</div>' if cause.confirm else "")
            + (f'<div class="links">Evidence: {links}</div>' if links else "")
            + "</li>")
    return '<h2 id="causes">Likely causes</h2><ol class="causes">' + "".join(items) + "</ol>"


def _link(url: str) -> str:
    """Only http(s) URLs become links (no `javascript:`); anything else is shown as text."""
    if not url.startswith(("https://", "http://")):
        return f"<span>{escape(url)}</span>"
    short = url.split("://", 1)[1].removeprefix("github.com/")
    return f'<a href="{escape(url)}" rel="noopener noreferrer" target="_blank">{escape(short)}</a>'


def _table(table: Table) -> str:
    head = "".join(f"<th>{escape(str(h))}</th>" for h in table.header)
    rows = []
    for i, row in enumerate(table.rows):
        cells = "".join(_cell(v) for v in row)
        rows.append(f'<tr class="onset">{cells}</tr>' if i in table.highlight else f"<tr>{cells}</tr>")
    note = f'<p class="note">{escape(table.note)}</p>' if table.note else ""
    return f"<h2>{escape(table.title)}</h2><table><tr>{head}</tr>{''.join(rows)}</table>{note}"


def _cell(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return f"<td>{'' if value is None else escape(str(value))}</td>"
    if isinstance(value, float):
        return f'<td class="num">{escape(fmt_value(value) if not math.isfinite(value) else f"{value:.8g}")}</td>'
    if isinstance(value, int):
        return f'<td class="num">{value}</td>'
    return f"<td>{escape(str(value))}</td>"


def _findings(findings: Sequence[Finding], num_suppressed: int) -> str:
    if not findings:
        return '<h2 id="findings">Findings</h2><p class="note">No findings.</p>'
    shown = sorted(findings, key=lambda f: (-f.severity, f.step is None, f.step or 0))[:_MAX_FINDING_ROWS]
    located = any(f.location for f in shown)
    rows = "".join(
        f'<tr><td><code>{escape(f.code)}</code></td><td class="sev-{escape(str(f.severity))}">{escape(str(f.severity))}</td>'
        f'<td class="num">{"" if f.step is None else f.step}</td><td class="num">{"" if f.rank is None else f.rank}</td>'
        f"<td>{escape(f.message)}</td>"
        + (f'<td class="mono">{escape(f.location or "")}</td>' if located else "") + "</tr>"
        for f in shown)
    hidden = len(findings) - len(shown) + num_suppressed
    note = (f'<p class="note">{hidden} more findings not shown (repeats of the codes above); '
            "`lossguard analyze --format json` lists them.</p>") if hidden > 0 else ""
    where = "<th>where</th>" if located else ""
    return ('<h2 id="findings">Findings</h2><table class="findings"><tr><th>code</th><th>severity</th>'
            f"<th>step</th><th>rank</th><th>message</th>{where}</tr>{rows}</table>{note}")


def _run(facts: Mapping[str, Any], origin: Mapping[str, str], inputs: Sequence[str]) -> str:
    parts = ['<h2 id="run">Run configuration and environment</h2>']
    if facts:
        rows = "".join(f"<tr><td><code>{escape(str(k))}</code></td><td>{escape(str(v))}</td>"
                       f"<td>{escape(str(origin.get(k, '')))}</td></tr>" for k, v in facts.items())
        parts.append(f'<table class="facts"><tr><th>setting</th><th>value</th><th>from</th></tr>{rows}</table>')
    else:
        parts.append('<p class="note">Nothing known about the config or versions: pass --config and --env '
                     "to `lossguard analyze`, or keep DeepSpeed's config dump in the log.</p>")
    if inputs:
        items = "".join(f'<li class="mono">{escape(str(p))}</li>' for p in inputs)
        parts.append(f'<p class="note">Read from:</p><ul class="inputs">{items}</ul>')
    return "".join(parts)


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
    window = [r for r in diagnosis.result.onset_window if r.kind != EVENT or r.event != "facts"]
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


def _version() -> str:
    from lossguard import __version__

    return __version__


__all__ = ["PANELS", "REPORT_FILENAME", "Series", "Table", "diagnosis_html", "merge_series", "render_html",
           "script_json", "write_html"]
