"""`lossguard analyze` of two checkouts on the same big log, interleaved, next to `grep -c`: for a change's
speed on a box whose speed drifts (a shared VM), where two separate runs of `analyze_speed.py` minutes apart
differ more than the change does.

    python bench/analyze_ab.py OTHER_CHECKOUT [--lines 1000000] [--rounds 15]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from analyze_speed import build_log, timed  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("other", type=Path, help="another checkout of lossguard (its src/ is run)")
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "train.log"
        build_log(log, args.lines)
        analyze = ["-m", "lossguard", "analyze", "--format", "json", "--fail-on", "never", str(log)]
        arms = {"grep -c": ["grep", "-c", "loss", str(log)],
                "this checkout": ["env", f"PYTHONPATH={ROOT / 'src'}", sys.executable, *analyze],
                str(args.other): ["env", f"PYTHONPATH={args.other / 'src'}", sys.executable, *analyze]}
        times: dict[str, list[float]] = {name: [] for name in arms}
        for cmd in arms.values():
            timed(cmd)  # warm-up: page cache, bytecode
        for _ in range(args.rounds):
            for name, cmd in arms.items():
                times[name].append(timed(cmd)[0])
        grep = min(times["grep -c"])
        for name, runs in times.items():
            print(f"{name:>40}: best {min(runs):.3f} s ({min(runs) / grep:.2f}x grep -c), "
                  f"median {statistics.median(runs):.3f} s ({statistics.median(runs) / statistics.median(times['grep -c']):.2f}x)")


if __name__ == "__main__":
    main()
