"""Wall time of `lossguard probe` on the built-in tiny model: 4 arms x 30 steps, 2 CPU ranks each.

    python bench/probe_speed.py [--steps 30] [--parallel]

The config is bf16 ZeRO-2 with overlap_comm on and check_grad_overflow off, so `--arms auto` yields exactly
4 arms: baseline, bf16.check_grad_overflow: true, overlap_comm: false, ZeRO-3. Prints the wall time of the
whole probe (job start-up, training, analysis, comparison) and of each arm. Target: <= 90 s on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

CONFIG = {"zero_optimization": {"stage": 2, "overlap_comm": True}, "gradient_clipping": 1.0,
          "bf16": {"enabled": True, "check_grad_overflow": False}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--parallel", action="store_true")
    args = parser.parse_args()
    from lossguard.probe.api import probe

    with tempfile.TemporaryDirectory(prefix="probe-bench-") as tmp:
        config = Path(tmp) / "ds.json"
        config.write_text(json.dumps(CONFIG))
        start = time.monotonic()
        result = probe(config, steps=args.steps, report_dir=Path(tmp) / "out", parallel=args.parallel)
        wall_s = time.monotonic() - start
    outcomes = result.comparison.outcomes
    for o in outcomes:
        print(f"  {o.arm.name:<40} {o.verdict:<9} steps {o.last_step}  job {o.run.wall_s:5.1f} s")
    print(f"probe: {len(outcomes)} arms x {args.steps} steps{' (parallel)' if args.parallel else ''}: "
          f"{wall_s:.1f} s wall on {os.cpu_count()} cores (load {os.getloadavg()[0]:.1f}); target <= 90 s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
