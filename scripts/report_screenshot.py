"""Screenshot an HTML report in headless Chromium: `python scripts/report_screenshot.py REPORT.html OUT.png`.

Used to make docs/report.png:
    PYTHONPATH=src python -m lossguard analyze tests/fixtures/html/hf_hidden_nan.log --html /tmp/report.html
    python scripts/report_screenshot.py /tmp/report.html docs/report.png --height 1500
Drives Chromium with the same pipe-based DevTools client as the browser tests.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration"))

from cdp_browser import Browser, find_chromium  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--width", type=int, default=1000)
    parser.add_argument("--height", type=int, default=1500, help="pixels from the top of the page")
    args = parser.parse_args()
    executable = find_chromium()
    if executable is None:
        print("Chromium not found: run scripts/install_browser.sh", file=sys.stderr)
        return 2
    with Browser(executable, width=args.width, height=args.height) as browser:
        record = browser.open(args.report)
        problems = record.console + record.exceptions + record.log_entries + record.dialogs
        if problems or len(record.requests) != 1:
            print(f"the page is not clean: {problems} {record.requests}", file=sys.stderr)
            return 1
        args.out.write_bytes(browser.screenshot({"x": 0, "y": 0, "width": args.width, "height": args.height}))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
