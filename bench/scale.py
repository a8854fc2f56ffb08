"""How the live guard's per-step cost grows with the number of ranks.

Each optimizer step, every rank gathers every rank's vector (`dist.gather_rows`) and runs the detectors over
all of the rows (`Monitor.analyse_rows`): the host time and the bytes moved grow with the world size. This
bench builds a real `Monitor` in one process and hands `analyse_rows` the rows a real gather would return at
simulated world sizes (healthy rows: a falling loss with per-rank noise, label counts, a grad norm, the LR),
and prints per-step host time (median over steps, after warm-up) and the bytes one rank receives.

    python bench/scale.py [--sizes 2,8,64,512,2048,8192] [--steps 30]

Nothing here is asserted: the table is the figure (issue: the cost should stay flat in the world size).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build_monitor():
    import torch

    from lossguard.monitor.core import Monitor
    from lossguard.monitor.options import GuardOptions

    model = torch.nn.Sequential(torch.nn.Embedding(64, 16), torch.nn.Linear(16, 64))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    options = GuardOptions(console=False, fingerprint_every=0)
    return Monitor(options, model, optimizer, entry="bench")


def healthy_rows(monitor, world: int, step: int, rng: random.Random) -> list[list[float]]:
    import torch

    from lossguard.monitor import wire

    rows = []
    loss = 2.5 * 0.995 ** step
    for _ in range(world):
        values = wire.StepValues(raw_loss=loss + rng.uniform(-0.05, 0.05), num_label_tokens=float(rng.randint(400, 512)),
                                 min_label_tokens=float(rng.randint(100, 128)), grad_norm=1.0 + rng.random(),
                                 lrs=[1e-4])
        rows.append(monitor.layout.encode(values, torch.device("cpu")).tolist())
    return rows


def per_step_ms(world: int, steps: int, warmup: int = 5) -> tuple[float, int]:
    monitor = build_monitor()
    rng = random.Random(world)
    times = []
    row_bytes = 0
    for step in range(1, warmup + steps + 1):
        rows = healthy_rows(monitor, world, step, rng)
        row_bytes = len(rows[0]) * 8
        start = time.perf_counter()
        findings = monitor.analyse_rows(step, rows)
        elapsed = time.perf_counter() - start
        if findings:
            sys.exit(f"unexpected findings on a healthy step at world size {world}: {findings}")
        if step > warmup:
            times.append(elapsed)
    monitor.close()
    return statistics.median(times) * 1e3, row_bytes * world


def main() -> None:
    sys.path.insert(0, str(ROOT / "src"))
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="2,8,64,512,2048,8192")
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    results = [(world, *per_step_ms(world, args.steps)) for world in sizes]
    base = next((ms for world, ms, _ in results if world == 8), results[0][1])
    print(f"{'world size':>10}  {'host ms / step':>14}  {'x at 8 ranks':>12}  {'bytes received / step':>22}")
    for world, ms, received in results:
        print(f"{world:>10}  {ms:>14.2f}  {ms / base:>11.1f}x  {received:>22,}")
    print("(healthy steps; the analysis every rank runs on the gathered rows, after the gather)")


if __name__ == "__main__":
    main()
