"""How the live guard's per-step cost grows with the number of ranks, on both of its paths.

Full detail (every step up to `detail_every_step_up_to` ranks, and the steps above it that need a look at
each rank): every rank gathers every rank's vector (`dist.gather_rows`) and runs the detectors over all the
rows (`Monitor.analyse_rows`). Summary (the healthy steps above the threshold): every rank adds its
contribution to one all_reduce (`summary.contributions`, `dist.reduce_summary`), reads the summary, decides
whether to look closer (`Exchange.note`, monitor/exchange.py) and feeds one run-level record (`Monitor.analyse_summary`).

This bench builds real `Monitor`s in one process and hands them what the collectives would return at
simulated world sizes (healthy rows: a falling loss with per-rank noise, label counts, a grad norm, the LR):
the gathered rows, and for the summary path their all_reduce computed on the host with the summary's own
reduction code (not timed: on a cluster it is the collective's time). Timed per step (median over steps,
after warm-up): full = `analyse_rows`; summary = this rank's contribution + reading the summary + the
decision + the engine feed. Bytes: what one rank receives per step (all rows; the reduced summary).

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


def build_monitor(**options):
    import torch

    from lossguard.monitor.core import Monitor
    from lossguard.monitor.options import GuardOptions

    model = torch.nn.Sequential(torch.nn.Embedding(64, 16), torch.nn.Linear(16, 64))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return Monitor(GuardOptions(console=False, fingerprint_every=0, **options), model, optimizer, entry="bench")


def healthy_rows(layout, world: int, step: int, rng: random.Random) -> list[list[float]]:
    import torch

    from lossguard.monitor import wire

    rows = []
    loss = 2.5 * 0.995 ** step
    for _ in range(world):
        values = wire.StepValues(raw_loss=loss + rng.uniform(-0.05, 0.05), num_label_tokens=float(rng.randint(400, 512)),
                                 min_label_tokens=float(rng.randint(100, 128)), grad_norm=1.0 + rng.random(),
                                 lrs=[1e-4])
        rows.append(layout.encode(values, torch.device("cpu")).tolist())
    return rows


def summary_step(monitor, step: int, reduced: list[float], own) -> list:
    """What a rank does on a healthy step above the threshold, after its vector is built."""
    from lossguard.monitor import summary

    summary.contributions(monitor.layout, own)  # this rank's part of the all_reduce (its result is `reduced`)
    seen = summary.Summary.read(monitor.layout, reduced)
    if monitor.exchange.note(step, seen):
        sys.exit(f"a healthy step asked for detail: {monitor.exchange.note(step, seen)}")
    return monitor.analyse_summary(step, seen)


def gathered_step(monitor, step: int, rows: list[list[float]]) -> list:
    """A step above the threshold that gathers (the first step, or one the summary asked about) with
    nothing wrong on any rank: the host reduction of the rows, then the ranks that stand out (none) and
    the run-level record through the engine."""
    from lossguard.monitor import summary

    return monitor.analyse_rows(step, rows, (), summary.of_rows(monitor.layout, rows))


def per_step_ms(world: int, steps: int, warmup: int = 5) -> tuple[float, float, int, int]:
    import torch

    from lossguard.monitor import summary

    full, reduced_path = build_monitor(), build_monitor(detail_every_step_up_to=0)
    gathered = build_monitor(detail_every_step_up_to=0)
    rng = random.Random(world)
    times: dict[str, list[float]] = {"full": [], "gathered": [], "summary": []}
    reductions = []
    for step in range(1, warmup + steps + 1):
        rows = healthy_rows(full.layout, world, step, rng)
        # the all_reduce's result and this rank's row, kept for the summary path's own loop (not timed)
        own = torch.tensor(rows[0], dtype=torch.float64)
        reductions.append((summary.reduce_on_host(reduced_path.layout, rows), own))
        timed(times["full"], step > warmup, world, full.analyse_rows, step, rows)
        timed(times["gathered"], step > warmup, world, gathered_step, gathered, step, rows)
    # Timed apart from the full path: building 8,192 rows between two steps would leave caches cold that a
    # summary step itself does not touch (+0.2 ms at 8,192 on this box, none of it the guard's work).
    for step, (reduced, own) in enumerate(reductions, 1):
        timed(times["summary"], step > warmup, world, summary_step, reduced_path, step, reduced, own)
    full.close()
    gathered.close()
    reduced_path.close()
    row_bytes = len(rows[0]) * 8
    return (statistics.median(times["full"]) * 1e3, statistics.median(times["gathered"]) * 1e3,
            statistics.median(times["summary"]) * 1e3, row_bytes * world, len(reductions[0][0]) * 8)


def timed(into: list[float], keep: bool, world: int, run, *args) -> None:
    start = time.perf_counter()
    findings = run(*args)
    elapsed = time.perf_counter() - start
    if findings:
        sys.exit(f"unexpected findings on a healthy step at world size {world}: {findings}")
    if keep:
        into.append(elapsed)


def main() -> None:
    sys.path.insert(0, str(ROOT / "src"))
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="2,8,64,512,2048,8192")
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    results = [(world, *per_step_ms(world, args.steps)) for world in sizes]
    base = {path: next((r[path] for r in results if r[0] == 8), results[0][path]) for path in (1, 2, 3)}
    print(f"{'world size':>10}  {'full ms/step':>12}  {'x at 8':>7}  {'bytes in':>11}   {'gathered ms':>11}  "
          f"{'x at 8':>7}   {'summary ms/step':>15}  {'x at 8':>7}  {'bytes in':>8}")
    for world, full_ms, gathered_ms, summary_ms, full_bytes, summary_bytes in results:
        print(f"{world:>10}  {full_ms:>12.2f}  {full_ms / base[1]:>6.1f}x  {full_bytes:>11,}   {gathered_ms:>11.2f}  "
              f"{gathered_ms / base[2]:>6.1f}x   {summary_ms:>15.3f}  {summary_ms / base[3]:>6.1f}x  {summary_bytes:>8,}")
    print("(healthy steps, after the collective. full: every rank's record through the detectors, the path up "
          "to detail_every_step_up_to ranks. Above it, gathered: a step that gathers the rows (the first, "
          "or one the summary asked about), their host reduction, the ranks that stand out and the run-level "
          "record; summary: every other step, fingerprint steps included.)")


if __name__ == "__main__":
    main()
