"""The sections of the HTML report page: banner, plots, causes, tables, findings, run facts.

Pure string building; every string from a log, a config or a caller goes through `html.escape`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from typing import Any

from lossguard.core.findings import Finding
from lossguard.diagnose.diagnosis import deciding_facts
from lossguard.diagnose.ranking import Cause
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


def banner_html(verdict: str | None, signature: str | None, headline: str) -> str:
    kind = verdict if verdict in _VERDICTS else "unknown"
    label = (verdict or "report").upper()
    sig = f'<span class="sig">{escape(signature)}</span>' if signature else ""
    return (f'<header class="banner {kind}" id="verdict"><span class="verdict">{escape(label)}</span>{sig}'
            f'<div class="headline">{escape(headline)}</div></header>')


def plots_html(series: Series, markers: Sequence[tuple[str, int]]) -> tuple[str, dict]:
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
                          f"{legend_html(plot)}{render_svg(plot, plot_id)}</figure>")
    return "".join(html_parts), data


def legend_html(plot) -> str:
    if len(plot.lines) == 1 and plot.lines[0].name == "all":
        return ""
    keys = "".join(f'<span class="key"><i style="background:{line.color}"></i>{escape(line.name)}</span>'
                   for line in plot.lines)
    return f'<div class="legend">{keys}</div>'


def causes_html(causes: Sequence[Cause]) -> str:
    if not causes:
        return ""
    items = []
    for cause in causes:
        pct = max(0.0, min(1.0, cause.confidence)) * 100
        evidence = "".join(f"<li>{escape(line)}</li>" for line in cause.evidence)
        evidence += "".join(f"<li>against: {escape(line)}</li>" for line in cause.against)
        links = " ".join(link_html(url) for url in cause.links)
        items.append(
            f'<li class="cause" id="cause-{escape(cause.id)}"><div><span class="conf">{escape(cause.likelihood)}</span>'
            f'<span class="bar"><span style="width:{pct:.1f}%"></span></span>'
            f'<span class="cause-title">{escape(cause.title)}</span> <code>{escape(cause.id)}</code></div>'
            + (f'<ul class="evidence">{evidence}</ul>' if evidence else "")
            + (f'<div class="fix"><b>Fix:</b> {escape(cause.fix)}</div>' if cause.fix else "")
            + (f'<div class="confirm"><b>Confirm:</b> {escape(cause.confirm)}</div>' if cause.confirm else "")
            + (f'<div class="links">Documented in: {links}</div>' if links else "")
            + "</li>")
    deciding = "".join(f"<li>{escape(line)}</li>" for line in deciding_facts(list(causes)))
    decide = (f'<p class="decide">The inputs do not show what would decide between these causes; supply:</p>'
              f'<ul class="decide">{deciding}</ul>') if deciding else ""
    return '<h2 id="causes">Causes, ranked</h2><ol class="causes">' + "".join(items) + "</ol>" + decide


def link_html(url: str) -> str:
    """Only http(s) URLs become links (no `javascript:`); anything else is shown as text."""
    if not url.startswith(("https://", "http://")):
        return f"<span>{escape(url)}</span>"
    short = url.split("://", 1)[1].removeprefix("github.com/")
    return f'<a href="{escape(url)}" rel="noopener noreferrer" target="_blank">{escape(short)}</a>'


def table_html(table: Table) -> str:
    head = "".join(f"<th>{escape(str(h))}</th>" for h in table.header)
    rows = []
    for i, row in enumerate(table.rows):
        cells = "".join(cell_html(v) for v in row)
        rows.append(f'<tr class="onset">{cells}</tr>' if i in table.highlight else f"<tr>{cells}</tr>")
    note = f'<p class="note">{escape(table.note)}</p>' if table.note else ""
    return f"<h2>{escape(table.title)}</h2><table><tr>{head}</tr>{''.join(rows)}</table>{note}"


def cell_html(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return f"<td>{'' if value is None else escape(str(value))}</td>"
    if isinstance(value, float):
        return f'<td class="num">{escape(fmt_value(value) if not math.isfinite(value) else f"{value:.8g}")}</td>'
    if isinstance(value, int):
        return f'<td class="num">{value}</td>'
    return f"<td>{escape(str(value))}</td>"


def findings_html(findings: Sequence[Finding], num_suppressed: int) -> str:
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


def run_html(facts: Mapping[str, Any], origin: Mapping[str, str], inputs: Sequence[str]) -> str:
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
