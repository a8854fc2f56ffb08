"""The HTML report as text: size bound, escaping, non-finite points, thinning, axes. The browser tests
(tests/integration/test_html_report.py) check what Chromium makes of it."""

from __future__ import annotations

import importlib.util
import json
import math
import re
from pathlib import Path

from lossguard.api import analyze
from lossguard.core.series import Downsampled, SeriesBook
from lossguard.report.html import PANELS, diagnosis_html, merge_series, render_html, script_json, write_html
from lossguard.report.svg import make_plot, nice_ticks, render_svg, thin

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
MAX_REPORT_BYTES = 2 * 1024 * 1024


def _fixtures_module():
    spec = importlib.util.spec_from_file_location("make_html_fixtures", FIXTURES / "make_html_fixtures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _data_block(page: str) -> dict:
    match = re.search(r'<script type="application/json" id="lossguard-data">(.*?)</script>', page, re.S)
    assert match, "the plot data block is missing"
    return json.loads(match.group(1))


def test_report_of_a_100k_step_run_is_under_2mb(tmp_path):
    log = _fixtures_module().write_hf_log(tmp_path / "long.log", steps=100_000, fail_at=61_000)
    diagnosis = analyze([log])
    assert diagnosis.signature == "nonfinite-hidden" and diagnosis.onset_step == 61_000
    path = write_html(diagnosis, tmp_path / "report" / "report.html")
    size = path.stat().st_size
    assert size <= MAX_REPORT_BYTES, f"{size} bytes"
    page = path.read_text(encoding="utf-8")
    assert "onset 61k" in page
    steps = [p[0] for p in _data_block(page)["plots"]["plot-0"]["lines"][0]["points"]]
    # SeriesBook keeps every k-th step (k = 64 here), so the last point drawn is within a stride or two
    # of the end; the report's own thinning must not shorten the range further.
    assert steps[0] <= 64 and steps[-1] >= 99_000, steps[-3:]


def test_worst_case_series_book_stays_under_2mb():
    """SeriesBook keeps at most `capacity` points per (signal, rank) whatever the run length, so every
    plotted signal on 8 ranks plus the averaged line, each full, is the largest page series can make."""
    book = SeriesBook()
    for signal in PANELS:
        for rank in [None, *range(8)]:
            line = Downsampled(capacity=book.capacity, stride=64, seen=100_000 * 8)
            line.points = [(s * 49, 1.0 + math.sin(s / 7.0 + (rank or 0)) / (1 + s)) for s in range(book.capacity)]
            book.series[(signal, rank)] = line
    page = render_html(series=book.to_dict(), verdict="broken", signature="nonfinite", headline="x")
    assert len(page.encode("utf-8")) <= MAX_REPORT_BYTES


def test_script_json_cannot_close_the_script_or_open_markup():
    text = script_json({"name": "</script><script>alert(1)</script>", "amp": "&lt;", "sep": "\u2028"})
    assert "<" not in text and ">" not in text and "&" not in text and "\u2028" not in text
    assert json.loads(text)["name"] == "</script><script>alert(1)</script>"


def test_strings_from_logs_and_callers_are_escaped():
    evil = "<script>alert(1)</script>"
    page = render_html(series={"loss": {evil: [(1, 2.0), (2, 1.5)]}, evil: {"all": [(1, 1.0)]}},
                       title=evil, verdict="warning", signature=evil, headline=evil, summary=[evil],
                       markers=[(evil, 1)], facts={"reduce_bucket_size": evil}, facts_origin={"x": evil},
                       inputs=[evil])
    assert evil not in page
    assert page.count("<script") == 2  # the data block and the page's own script, nothing else
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert _data_block(page)["plots"]["plot-0"]["lines"][0]["name"] == evil


def test_nonfinite_points_are_drawn_not_dropped():
    series = {"loss": {"all": [(1, 2.0), (2, 1.9), (3, math.nan), (4, math.inf), (5, -math.inf), (6, 1.8)]}}
    page = render_html(series=series)
    assert page.count('class="nf"') == 3
    assert "non-finite: nan +inf -inf" in page
    points = _data_block(page)["plots"]["plot-0"]["lines"][0]["points"]
    assert [v for _, v in points] == [2.0, 1.9, "nan", "+inf", "-inf", 1.8]
    path = re.search(r'class="series" data-name="all" d="([^"]+)"', page).group(1)
    assert path.count("M") == 2, "a non-finite point breaks the line"


def test_thinning_keeps_spikes_and_nonfinite_points():
    points = [(s, 1.0) for s in range(100_000)]
    points[54_321] = (54_321, 50.0)
    points[77_777] = (77_777, math.nan)
    kept = thin(points, 500)
    assert len(kept) <= 520
    assert (54_321, 50.0) in kept
    assert any(s == 77_777 and math.isnan(v) for s, v in kept)
    assert kept == sorted(kept, key=lambda p: p[0])


def test_grad_norm_spanning_decades_uses_a_log_axis_and_loss_does_not():
    wide = [(s, 10.0 ** (s / 20)) for s in range(100)]
    assert make_plot("grad_norm", "grad norm", {"all": wide}, (0, 99), log_allowed=True).log_y
    assert not make_plot("loss", "loss", {"all": wide}, (0, 99), log_allowed=False).log_y
    with_zero = [(0, 0.0), *wide[1:]]
    assert not make_plot("grad_norm", "grad norm", {"all": with_zero}, (0, 99), log_allowed=True).log_y
    svg = render_svg(make_plot("grad_norm", "grad norm", {"all": wide}, (0, 99), log_allowed=True), "p")
    assert "(log)" in svg and "1e0" in svg


def test_nice_ticks():
    assert nice_ticks(0, 100, 5) == [0, 20, 40, 60, 80, 100]
    assert nice_ticks(1.98, 2.31, 5)[0] >= 1.98


def test_report_of_the_hidden_nan_fixture(tmp_path):
    fixtures = FIXTURES / "html"
    diagnosis = analyze([fixtures / "hf_hidden_nan.log"])
    page = diagnosis_html(diagnosis)
    assert 'class="banner broken"' in page and "nonfinite-hidden" in page
    assert "since step 181" in page
    signals = re.findall(r'data-signal="([^"]+)"', page)
    assert signals == ["loss", "grad_norm", "lr"]
    assert "zero12-overlap-race" in page and "overlap_comm" in page
    assert 'href="https://github.com/deepspeedai/DeepSpeed/issues/4298"' in page
    assert "Around the onset" in page and '<tr class="onset">' in page


def test_empty_and_healthy_reports_render():
    page = render_html(series={})
    assert "No numeric signals were logged" in page and 'class="banner unknown"' in page
    page = render_html(series={"loss": {"all": [(1, 1.0)]}}, verdict="healthy")
    assert 'class="banner healthy"' in page and "<circle" in page  # a single point still shows


def test_merge_series_names_one_line_per_arm_and_rank():
    baseline = {"loss": {"all": [(1, 2.0)]}, "grad_norm": {"rank0": [(1, 1.0)], "rank1": [(1, 1.1)]}}
    fixed = {"loss": {"all": [(1, 2.1)]}}
    merged = merge_series({"baseline": baseline, "overlap_comm=false": fixed})
    assert merged == {"loss": {"baseline": [(1, 2.0)], "overlap_comm=false": [(1, 2.1)]},
                      "grad_norm": {"baseline rank0": [(1, 1.0)], "baseline rank1": [(1, 1.1)]}}
    page = render_html(series=merged, markers=[("onset (baseline)", 1)])
    assert "overlap_comm=false" in page and "onset (baseline)" in page
