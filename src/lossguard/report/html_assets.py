"""The report page's inline CSS and its one small script (hover read-out on the plots).

Inline only: the page must open offline and make no request. The script builds DOM with `textContent`
(never `innerHTML`), so values and names from logs cannot become markup; the page's Content-Security-Policy
allows exactly this script (by hash) and nothing loaded from anywhere.
"""

from __future__ import annotations

import base64
import hashlib

CSS = """
:root { --ok: #2e7d32; --warn: #b26a00; --bad: #c62828; --ink: #1d1d1f; --dim: #666; --line: #ddd; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif;
       color: var(--ink); background: #fafafa; }
main { max-width: 940px; margin: 0 auto; padding: 0 16px 40px; }
h2 { font-size: 17px; margin: 28px 0 8px; border-bottom: 1px solid var(--line); padding-bottom: 4px; }
code, .mono { font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 12.5px; }
.banner { padding: 16px 20px; color: #fff; margin: 0 -16px 10px; }
.banner.healthy { background: var(--ok); } .banner.warning { background: var(--warn); }
.banner.broken { background: var(--bad); } .banner.unknown { background: #555; }
.banner .verdict { font-weight: 700; letter-spacing: .08em; border: 2px solid #fff; padding: 1px 8px;
                   margin-right: 10px; }
.banner .sig { font-weight: 700; font-size: 18px; }
.banner .headline { margin-top: 6px; font-size: 15px; }
.summary { color: var(--dim); margin: 2px 0; }
figure.plot { margin: 10px 0 14px; background: #fff; border: 1px solid var(--line); padding: 6px 6px 2px;
              position: relative; }
figure.plot svg { display: block; width: 100%; height: auto; }
.legend { font-size: 12px; color: var(--dim); margin: 0 0 2px 60px; }
.legend span.key { display: inline-block; margin-right: 12px; }
.legend i { display: inline-block; width: 14px; height: 3px; vertical-align: middle; margin-right: 4px; }
.tip { position: absolute; pointer-events: none; background: rgba(255,255,255,.95); border: 1px solid #999;
       padding: 3px 6px; font-size: 12px; white-space: pre; display: none; z-index: 2; }
ol.causes { padding-left: 22px; } ol.causes > li { margin-bottom: 14px; }
.conf { display: inline-block; width: 44px; font-weight: 700; }
.bar { display: inline-block; width: 80px; height: 8px; background: #eee; margin-right: 8px; vertical-align: middle; }
.bar > span { display: block; height: 8px; background: #1f77b4; }
.cause-title { font-weight: 600; }
.fix { margin: 4px 0; padding: 4px 8px; background: #eef7ee; border-left: 3px solid var(--ok); }
.confirm, .links, ul.evidence { color: var(--dim); margin: 2px 0; }
ul.evidence { padding-left: 18px; }
table { border-collapse: collapse; width: 100%; background: #fff; font-size: 13px; }
th, td { border: 1px solid var(--line); padding: 3px 6px; text-align: left; vertical-align: top; }
th { background: #f0f0f0; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.onset td { background: #fdecea; }
.sev-critical { color: var(--bad); font-weight: 700; } .sev-error { color: var(--bad); }
.sev-warning { color: var(--warn); } .sev-info { color: var(--dim); }
.note { color: var(--dim); font-size: 12.5px; }
footer { color: var(--dim); font-size: 12px; margin-top: 30px; }
"""

# Hover read-out: nearest logged point of every line at the cursor's step. Reads the plot data from the
# JSON block; no network, no eval, no innerHTML.
JS = """
(function () {
  var node = document.getElementById('lossguard-data');
  if (!node) { return; }
  var data = JSON.parse(node.textContent);
  function nearest(points, step) {
    var lo = 0, hi = points.length - 1;
    if (hi < 0) { return null; }
    while (lo < hi) {
      var mid = (lo + hi) >> 1;
      if (points[mid][0] < step) { lo = mid + 1; } else { hi = mid; }
    }
    if (lo > 0 && Math.abs(points[lo - 1][0] - step) <= Math.abs(points[lo][0] - step)) { lo -= 1; }
    return points[lo];
  }
  function fmt(v) { return typeof v === 'number' ? String(Number(v.toPrecision(8))) : String(v); }
  Object.keys(data.plots).forEach(function (id) {
    var plot = data.plots[id];
    var svg = document.getElementById(id);
    if (!svg) { return; }
    var figure = svg.parentNode;
    var tip = document.createElement('div');
    tip.className = 'tip';
    figure.appendChild(tip);
    var cross = document.createElementNS('http://www.w3.org/2000/svg', 'line');
    cross.setAttribute('y1', plot.box[1]); cross.setAttribute('y2', plot.box[3]);
    cross.setAttribute('stroke', '#555'); cross.setAttribute('stroke-width', '0.8');
    cross.setAttribute('visibility', 'hidden');
    svg.appendChild(cross);
    svg.addEventListener('mousemove', function (ev) {
      var rect = svg.getBoundingClientRect();
      var vb = svg.viewBox.baseVal;
      var x = (ev.clientX - rect.left) * vb.width / rect.width;
      if (x < plot.box[0] || x > plot.box[2]) { tip.style.display = 'none'; return; }
      var step = plot.x[0] + (x - plot.box[0]) / (plot.box[2] - plot.box[0]) * (plot.x[1] - plot.x[0]);
      var lines = [];
      plot.lines.forEach(function (line) {
        var p = nearest(line.points, step);
        if (p) { lines.push(line.name + ': ' + fmt(p[1]) + '  (step ' + p[0] + ')'); }
      });
      if (lines.length === 0) { return; }
      cross.setAttribute('x1', x); cross.setAttribute('x2', x); cross.setAttribute('visibility', 'visible');
      tip.textContent = lines.join('\\n');
      tip.style.display = 'block';
      var fx = ev.clientX - figure.getBoundingClientRect().left;
      tip.style.left = (fx > figure.clientWidth * 0.6 ? fx - tip.offsetWidth - 12 : fx + 12) + 'px';
      tip.style.top = '8px';
    });
    svg.addEventListener('mouseleave', function () {
      tip.style.display = 'none'; cross.setAttribute('visibility', 'hidden');
    });
  });
})();
"""


def script_hash(source: str) -> str:
    """CSP source expression that allows exactly this inline script."""
    digest = hashlib.sha256(source.encode("utf-8")).digest()
    return "'sha256-" + base64.b64encode(digest).decode("ascii") + "'"


def content_security_policy() -> str:
    # No fetch, image, font, frame or form target anywhere: the report must never reach the network.
    return (f"default-src 'none'; style-src 'unsafe-inline'; script-src {script_hash(JS)}; "
            "img-src data:; base-uri 'none'; form-action 'none'")
