"""Wall time of `lossguard lint` on one config next to `python -c pass` (median of N runs).

    python bench/lint_speed.py [CONFIG] [--runs 11]

Target: lint <= 0.3 s. Prints one line per command and the ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def median_wall_s(argv: list[str], runs: int, env: dict[str, str]) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default=str(ROOT / "tests/fixtures/lint/llava_zero2.json"))
    parser.add_argument("--runs", type=int, default=11)
    opts = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    freeze = str(ROOT / "tests/fixtures/lint/llava.freeze")
    baseline = median_wall_s([sys.executable, "-c", "pass"], opts.runs, env)
    lint_env = median_wall_s([sys.executable, "-m", "lossguard", "lint", opts.config, "--env", freeze], opts.runs, env)
    lint_installed = median_wall_s([sys.executable, "-m", "lossguard", "lint", opts.config], opts.runs, env)
    print(f"python -c pass                      {baseline:.3f} s")
    print(f"lossguard lint --env FILE           {lint_env:.3f} s  ({lint_env / baseline:.1f}x)")
    print(f"lossguard lint (installed versions) {lint_installed:.3f} s  ({lint_installed / baseline:.1f}x)")
    print(f"target <= 0.300 s: {'met' if max(lint_env, lint_installed) <= 0.3 else 'MISSED'} (median of {opts.runs})")


if __name__ == "__main__":
    main()
