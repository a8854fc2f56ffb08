"""Line plots over steps as inline SVG, drawn server-side in pure Python (no plotting library, no JS needed).

A plot is one signal: one line per named series (`rank0`, `rank1`, a probe arm, ...), every panel on the
same step axis so the onset marker lines up. NaN/Inf are never dropped: they break the line and show as
red markers in a strip above the plot area. Points are thinned for display only (min/max per bucket, so a
spike survives); detection has already seen every step.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from html import escape

Point = tuple[int, float]

WIDTH_PX = 880
HEIGHT_PX = 210
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 14, 26, 30  # margins; the top one holds the NaN/Inf strip
_STRIP_Y = 12
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22",
           "#7f7f7f", "#393b79")
NONFINITE_COLOR = "#d62728"
MARKER_COLOR = "#d62728"
# Display budget: ~30 bytes per point (SVG path + JSON), so a page of 36k points stays near 1 MB.
MAX_POINTS_PER_LINE = 900
MAX_POINTS_PER_PLOT = 6000
MAX_POINTS_PER_PAGE = 36000
_LOG_MIN_DECADES = 2.0


@dataclass(slots=True)
class Line:
    name: str
    color: str
    points: list[Point]


@dataclass(slots=True)
class Plot:
    """One panel, ready to draw; also what the page's hover script reads (see `to_data`)."""

    signal: str
    title: str
    lines: list[Line]
    x_range: tuple[float, float]
    y_range: tuple[float, float] = (0.0, 1.0)
    log_y: bool = False
    markers: list[tuple[str, int]] = field(default_factory=list)

    def to_data(self) -> dict:
        return {"signal": self.signal, "x": list(self.x_range), "y": list(self.y_range), "log": self.log_y,
                "box": [_LEFT, _TOP, WIDTH_PX - _RIGHT, HEIGHT_PX - _BOTTOM],
                "lines": [{"name": ln.name, "color": ln.color, "points": [[s, _json_value(v)] for s, v in ln.points]}
                          for ln in self.lines]}


def make_plot(signal: str, title: str, series: Mapping[str, Sequence[Point]], x_range: tuple[float, float],
              *, markers: Sequence[tuple[str, int]] = (), log_allowed: bool = False,
              max_points: int = MAX_POINTS_PER_PLOT) -> Plot:
    """Thin each named series for display and fix the axes. `series` maps a line name to (step, value)."""
    budget = max(40, min(MAX_POINTS_PER_LINE, max_points // max(1, len(series))))
    lines = [Line(name, PALETTE[i % len(PALETTE)], thin(sorted(points, key=lambda p: p[0]), budget))
             for i, (name, points) in enumerate(series.items())]
    finite = [v for line in lines for _, v in line.points if math.isfinite(v)]
    log_y = log_allowed and _wants_log(finite)
    return Plot(signal, title, lines, x_range, _y_range(finite, log_y), log_y, list(markers))


def thin(points: Sequence[Point], budget: int) -> list[Point]:
    """At most ~`budget` points: per bucket the min and max finite point, plus one of each non-finite kind."""
    if len(points) <= budget:
        return list(points)
    size = math.ceil(len(points) / max(1, budget // 2))
    out: list[Point] = []
    for start in range(0, len(points), size):
        idx = range(start, min(start + size, len(points)))
        finite = [i for i in idx if math.isfinite(points[i][1])]
        keep = set()
        if finite:
            keep.add(min(finite, key=lambda i: points[i][1]))
            keep.add(max(finite, key=lambda i: points[i][1]))
        kinds: dict[str, int] = {}
        for i in idx:
            if not math.isfinite(points[i][1]):
                kinds.setdefault(_kind(points[i][1]), i)
        keep.update(kinds.values())
        out.extend(points[i] for i in sorted(keep))
    return out


def render_svg(plot: Plot, plot_id: str) -> str:
    """The panel as an `<svg>` element. Every text from outside (line names, titles) is escaped."""
    parts = [f'<svg id="{escape(plot_id)}" class="plot-svg" viewBox="0 0 {WIDTH_PX} {HEIGHT_PX}" '
             f'width="{WIDTH_PX}" height="{HEIGHT_PX}" role="img" xmlns="http://www.w3.org/2000/svg" '
             f'aria-label="{escape(plot.title)} over steps">',
             f"<title>{escape(plot.title)} over steps</title>"]
    parts += _axes(plot)
    parts += _markers(plot)
    for line in plot.lines:
        parts += _line(plot, line)
    parts += _nonfinite(plot)
    parts.append(f'<rect class="plot-box" x="{_LEFT}" y="{_TOP}" width="{_plot_w()}" height="{_plot_h()}" '
                 'fill="none" stroke="#888" stroke-width="1"/>')
    parts.append("</svg>")
    return "".join(parts)


# -- scales ----------------------------------------------------------------------------------------------
def _plot_w() -> int:
    return WIDTH_PX - _LEFT - _RIGHT


def _plot_h() -> int:
    return HEIGHT_PX - _TOP - _BOTTOM


def _sx(plot: Plot, step: float) -> float:
    lo, hi = plot.x_range
    return _LEFT + (step - lo) / (hi - lo) * _plot_w()


def _sy(plot: Plot, value: float) -> float:
    lo, hi = plot.y_range
    if plot.log_y:
        value = math.log10(max(value, 10.0 ** lo))
    return _TOP + (1.0 - (value - lo) / (hi - lo)) * _plot_h()


def x_range_of(series: Mapping[str, Mapping[str, Sequence[Point]]]) -> tuple[float, float]:
    """One step axis for every panel."""
    steps = [p[0] for lines in series.values() for points in lines.values() for p in points]
    if not steps:
        return (0.0, 1.0)
    lo, hi = min(steps), max(steps)
    return (float(lo), float(hi)) if hi > lo else (lo - 0.5, hi + 0.5)


def _wants_log(finite: list[float]) -> bool:
    if not finite or min(finite) <= 0:
        return False
    return math.log10(max(finite) / min(finite)) >= _LOG_MIN_DECADES


def _y_range(finite: list[float], log_y: bool) -> tuple[float, float]:
    if not finite:
        return (0.0, 1.0)
    lo, hi = min(finite), max(finite)
    if log_y:
        return (math.floor(math.log10(lo)), math.ceil(math.log10(hi)))
    if hi == lo:
        pad = abs(hi) * 0.1 or 1.0
        return (lo - pad, hi + pad)
    pad = (hi - lo) * 0.06
    return (lo - pad if lo < 0 or lo - pad >= 0 else 0.0, hi + pad)


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / count
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    ticks, i = [], 0
    while first + i * step <= hi + step * 1e-9:
        ticks.append(round(first + i * step, 12))
        i += 1
    return ticks


def fmt_step(step: float) -> str:
    if abs(step) >= 1_000_000:
        return f"{step / 1e6:g}M"
    if abs(step) >= 10_000:
        return f"{step / 1e3:g}k"
    return f"{step:g}"


def fmt_value(value: float) -> str:
    if not math.isfinite(value):
        return str(value)
    if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
        return f"{value:.2g}"
    return f"{value:.4g}"


# -- drawing -----------------------------------------------------------------------------------------------
def _axes(plot: Plot) -> list[str]:
    out = ['<g class="axes" font-size="11" fill="#444">']
    bottom = HEIGHT_PX - _BOTTOM
    for step in nice_ticks(*plot.x_range, count=8):
        x = _sx(plot, step)
        out.append(f'<line x1="{x:.1f}" y1="{_TOP}" x2="{x:.1f}" y2="{bottom}" stroke="#eee"/>'
                   f'<text x="{x:.1f}" y="{bottom + 14}" text-anchor="middle">{fmt_step(step)}</text>')
    lo, hi = plot.y_range
    ticks = [float(k) for k in range(int(lo), int(hi) + 1)] if plot.log_y else nice_ticks(lo, hi)
    if plot.log_y and len(ticks) > 7:
        ticks = ticks[:: math.ceil(len(ticks) / 6)]
    for tick in ticks:
        y = _TOP + (1.0 - (tick - lo) / (hi - lo)) * _plot_h()
        label = f"1e{int(tick)}" if plot.log_y else fmt_value(tick)
        out.append(f'<line x1="{_LEFT}" y1="{y:.1f}" x2="{WIDTH_PX - _RIGHT}" y2="{y:.1f}" stroke="#eee"/>'
                   f'<text x="{_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{label}</text>')
    scale = " (log)" if plot.log_y else ""
    out.append(f'<text x="{WIDTH_PX - _RIGHT}" y="{HEIGHT_PX - 2}" text-anchor="end" fill="#777">step</text>'
               f'<text x="4" y="{_STRIP_Y + 4}" fill="#333" font-size="12" font-weight="600">'
               f"{escape(plot.title)}{scale}</text></g>")
    return out


def _markers(plot: Plot) -> list[str]:
    out = []
    for label, step in plot.markers:
        if not plot.x_range[0] <= step <= plot.x_range[1]:
            continue
        x = _sx(plot, step)
        anchor = "end" if x > WIDTH_PX * 0.8 else "start"
        dx = -4 if anchor == "end" else 4
        out.append(f'<g class="marker"><line x1="{x:.1f}" y1="{_TOP}" x2="{x:.1f}" y2="{HEIGHT_PX - _BOTTOM}" '
                   f'stroke="{MARKER_COLOR}" stroke-width="1.5" stroke-dasharray="5,3"/>'
                   f'<text x="{x + dx:.1f}" y="{_TOP + 12}" text-anchor="{anchor}" font-size="11" '
                   f'fill="{MARKER_COLOR}">{escape(label)} {fmt_step(step)}</text></g>')
    return out


def _line(plot: Plot, line: Line) -> list[str]:
    commands, pen_down = [], False
    for step, value in line.points:
        if not math.isfinite(value):
            pen_down = False
            continue
        x, y = _sx(plot, step), _sy(plot, value)
        commands.append(f"{'L' if pen_down else 'M'}{x:.1f} {y:.1f}")
        pen_down = True
    if not commands:
        return []
    out = [f'<path class="series" data-name="{escape(line.name)}" d="{"".join(commands)}" fill="none" '
           f'stroke="{line.color}" stroke-width="1.4" stroke-linejoin="round"/>']
    if len(commands) == 1:  # a single finite point draws no line: show it as a dot
        x, y = commands[0][1:].split()
        out.append(f'<circle cx="{x}" cy="{y}" r="2.5" fill="{line.color}"/>')
    return out


def _nonfinite(plot: Plot) -> list[str]:
    out, kinds_seen = [], set()
    for line in plot.lines:
        for step, value in line.points:
            if math.isfinite(value):
                continue
            kind = _kind(value)
            kinds_seen.add(kind)
            x = _sx(plot, step)
            out.append(_shape(kind, x, _STRIP_Y + 6, f"{line.name}: {kind} at step {step}"))
    if out:
        legend = " ".join(k for k in ("nan", "+inf", "-inf") if k in kinds_seen)
        out.insert(0, f'<g class="nonfinite" fill="{NONFINITE_COLOR}">')
        out.append(f'<text x="{WIDTH_PX - _RIGHT}" y="{_STRIP_Y + 2}" text-anchor="end" font-size="10">'
                   f"non-finite: {legend}</text></g>")
    return out


def _shape(kind: str, x: float, y: float, tip: str) -> str:
    title = f"<title>{escape(tip)}</title>"
    if kind == "nan":
        return f'<circle class="nf" cx="{x:.1f}" cy="{y}" r="3">{title}</circle>'
    tip_y, base_y = (y - 4, y + 3) if kind == "+inf" else (y + 4, y - 3)
    return (f'<path class="nf" d="M{x:.1f} {tip_y}L{x - 3.5:.1f} {base_y}L{x + 3.5:.1f} {base_y}Z">'
            f"{title}</path>")


def _kind(value: float) -> str:
    if math.isnan(value):
        return "nan"
    return "+inf" if value > 0 else "-inf"


def _json_value(value: float) -> float | str:
    # 8 significant digits: enough to read a sentinel (1.4142136 = sqrt 2) in the hover, half the bytes.
    return float(f"{value:.8g}") if math.isfinite(value) else _kind(value)
