"""HTML reports opened in a real headless Chromium (Debian's, installed by scripts/install_browser.sh).

Each page must render with no console message, no exception, no log error and no request other than the
file itself; the plots must show pixels; markup from a log file name, a config value or a caller's series
name must stay text and never run.
"""

from __future__ import annotations

import io
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

try:
    from .cdp_browser import Browser, find_chromium
except ImportError:  # tests/ is not a package: pytest put this directory on sys.path
    from cdp_browser import Browser, find_chromium

from lossguard.api import analyze
from lossguard.core.engine import Engine
from lossguard.core.records import Record
from lossguard.detectors import make_detectors
from lossguard.diagnose.diagnosis import diagnose
from lossguard.report.html import render_html, write_html

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "html"
XSS = "<script>alert(1)</script>"
PLOT_BLUE = (0x1F, 0x77, 0xB4)


def _chromium() -> str:
    found = find_chromium()
    if found is None:
        subprocess.run(["bash", str(ROOT / "scripts" / "install_browser.sh")], check=False, timeout=900)
        found = find_chromium()
    if found is None:
        pytest.skip("Chromium is not installed and scripts/install_browser.sh could not install it "
                    "(needs root and the Debian archive); the HTML report browser tests need a real browser")
    return found


@pytest.fixture(scope="module")
def browser():
    with Browser(_chromium()) as b:
        yield b


def _assert_clean(record, path: Path) -> None:
    assert record.console == [], f"console messages: {record.console}"
    assert record.exceptions == [], f"page exceptions: {record.exceptions}"
    errors = [e for e in record.log_entries if e.get("level") in ("error", "warning")]
    assert errors == [], f"browser log: {errors}"
    assert record.requests == [path.resolve().as_uri()], f"requests besides the file: {record.requests}"
    assert record.dialogs == [], f"a dialog opened: {record.dialogs}"


def _plot_pixels(browser: Browser, selector: str):
    image_module = pytest.importorskip("PIL.Image", reason="Pillow (dev extra) reads the screenshots")
    box = browser.evaluate(f"(() => {{ const r = document.querySelector({selector!r}).getBoundingClientRect();"
                           " return {x: r.left + window.scrollX, y: r.top + window.scrollY,"
                           " width: r.width, height: r.height}; })()")
    assert box["width"] > 300 and box["height"] > 100, box
    image = image_module.open(io.BytesIO(browser.screenshot(box))).convert("RGB")
    return image, set(image.getdata())


def test_hidden_nan_report_from_the_cli_renders_offline(browser, tmp_path):
    report = tmp_path / "report.html"
    run = _cli("analyze", FIXTURES / "hf_hidden_nan.log", "--html", report)
    assert run.returncode == 1, run.stderr  # critical findings
    assert f"HTML report: {report}" in run.stdout

    record = browser.open(report)
    _assert_clean(record, report)
    banner = browser.evaluate("document.querySelector('#verdict').innerText")
    assert "BROKEN" in banner and "nonfinite-hidden" in banner and "since step 181" in banner
    signals = browser.evaluate("[...document.querySelectorAll('figure.plot')].map(f => f.dataset.signal)")
    assert signals == ["loss", "grad_norm", "lr"]
    markers = browser.evaluate("[...document.querySelectorAll('#fig-loss .marker text')].map(t => t.textContent)")
    assert markers == ["onset 181"]
    for signal in signals:
        image, colors = _plot_pixels(browser, f"#fig-{signal} svg")
        assert len(colors) > 20, f"{signal}: plot looks blank ({len(colors)} colours)"
        assert any(_near(c, PLOT_BLUE) for c in colors), f"{signal}: no line pixels"
    causes = browser.evaluate("[...document.querySelectorAll('li.cause')].map(li => li.id)")
    assert causes[0] == "cause-zero12-overlap-race"
    facts = browser.evaluate("document.querySelector('table.facts').innerText")
    assert "overlap_comm" in facts and "0.14.0" in facts


def test_nan_points_show_as_red_markers(browser, tmp_path):
    diagnosis = analyze([FIXTURES / "hf_visible_nan.log"])
    report = write_html(diagnosis, tmp_path / "nan.html")
    _assert_clean(browser.open(report), report)
    assert browser.evaluate("document.querySelectorAll('#fig-loss .nf').length") == 60  # steps 241..300
    image, colors = _plot_pixels(browser, "#fig-loss svg")
    strip = image.crop((int(image.width * 0.7), 0, image.width, int(image.height * 0.12)))
    assert any(_near(c, (0xD6, 0x27, 0x28)) for c in strip.getdata()), "no red NaN markers above the plot"


def test_markup_in_log_names_config_values_and_series_names_stays_text(browser, tmp_path):
    evil_log = tmp_path / "run<img src=x onerror=alert(2)>.log"
    shutil.copy(FIXTURES / "hf_hidden_nan.log", evil_log)
    report = tmp_path / "xss.html"
    run = _cli("analyze", evil_log, "--config", FIXTURES / "ds_config_xss.json", "--html", report)
    assert run.returncode == 1, run.stderr
    _assert_clean(browser.open(report), report)
    text = browser.evaluate("document.body.innerText")
    assert XSS in text  # the config value, shown as text
    assert "run<img src=x onerror=alert(2)>.log" in text
    assert browser.evaluate("document.images.length") == 0
    assert browser.evaluate("document.scripts.length") == 2

    arms = {"loss": {"baseline": [(s, 2.0 - s / 100) for s in range(1, 50)],
                     "</script><script>alert(3)</script>": [(s, 2.1 - s / 90) for s in range(1, 50)]}}
    page = tmp_path / "arms.html"
    page.write_text(render_html(series=arms, title=XSS, headline=XSS), encoding="utf-8")
    _assert_clean(browser.open(page), page)
    assert browser.evaluate("document.title") == XSS
    legend = browser.evaluate("document.querySelector('#fig-loss .legend').innerText")
    assert "</script><script>alert(3)</script>" in legend
    # The hover script read the (escaped) JSON and shows the name as text.
    tip = browser.evaluate("""(() => {
        const svg = document.querySelector('#fig-loss svg'); const r = svg.getBoundingClientRect();
        svg.dispatchEvent(new MouseEvent('mousemove', {clientX: r.left + r.width / 2, clientY: r.top + 60,
                                                      bubbles: true}));
        return document.querySelector('#fig-loss .tip').textContent; })()""")
    assert "</script><script>alert(3)</script>: " in tip and "baseline: " in tip
    browser.pump(0.3)
    assert browser.record.dialogs == [] and browser.record.exceptions == []


def test_one_line_per_rank_and_per_arm(browser, tmp_path):
    engine = Engine(make_detectors())
    for step in range(1, 201):
        for rank in (0, 1):
            broken = rank == 1 and step >= 150
            loss = math.nan if broken else 2.3 - step / 400 + rank * 0.01
            engine.feed(Record(step=step, rank=rank, signals={"loss": loss, "grad_norm": 1.0 + rank / 10,
                                                              "lr": 1e-5}, source="monitor.jsonl"))
    diagnosis = diagnose(engine.finish())
    report = write_html(diagnosis, tmp_path / "ranks.html")
    _assert_clean(browser.open(report), report)
    names = browser.evaluate("[...document.querySelectorAll('#fig-loss path.series')].map(p => p.dataset.name)")
    assert names == ["rank0", "rank1"]
    assert browser.evaluate("document.querySelectorAll('#fig-loss .nf').length") > 0
    _, colors = _plot_pixels(browser, "#fig-loss svg")
    assert any(_near(c, PLOT_BLUE) for c in colors) and any(_near(c, (0xFF, 0x7F, 0x0E)) for c in colors)


def test_many_ranks_many_points_render(browser, tmp_path):
    series = {signal: {f"rank{r}": [(s * 50, 1.0 + math.sin(s / 9 + r) + r) for s in range(2048)]
                       for r in range(8)}
              for signal in ("loss", "grad_norm", "lr", "loss_scale", "num_label_tokens", "skipped_steps")}
    page = tmp_path / "big.html"
    page.write_text(render_html(series=series, verdict="warning", markers=[("onset", 61_000)]), encoding="utf-8")
    _assert_clean(browser.open(page), page)
    assert browser.evaluate("document.querySelectorAll('path.series').length") == 48


def _cli(*args) -> subprocess.CompletedProcess:
    """`python -m lossguard ARGS` in a real subprocess with this checkout's src on the path."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-m", "lossguard", *map(str, args)], env=env, capture_output=True,
                          text=True, timeout=120)


def _near(color: tuple, target: tuple, tolerance: int = 40) -> bool:
    return all(abs(a - b) <= tolerance for a, b in zip(color, target))
