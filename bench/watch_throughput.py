"""How many output lines per second `lossguard watch` sustains, next to the same child piped to `cat`.

    python bench/watch_throughput.py [--lines 1000000] [--repeat 3]

The child is a fast-printing Python process with a realistic mix of what a DeepSpeed + HF Trainer job
prints (a healthy run, so no banner): tqdm redraws on stderr (`\\r`, no newline), HF log dicts on stdout,
DeepSpeed `[INFO] ... step=N, skipped=0, lr=[...]` lines, DeepSpeed timer / engine INFO lines, Trainer
INFO lines, warnings, rank- and host-prefixed lines. It prints line by line with `print()` under
PYTHONUNBUFFERED=1, as it does under watch. Two mixes:

    typical:  a metrics line (HF dict, DeepSpeed step=) on 2 of every 100 lines (logging every 10 steps)
    metrics:  20 of every 100 lines are metrics (a log every step; the parser and all detectors run on them)

Both pipelines run the same child with the same environment; outputs end in /dev/null:

    cat:    child 2>&1 | cat > /dev/null
    watch:  lossguard watch -q --log FILE -- child > /dev/null 2> /dev/null

A "line" is one newline- or `\\r`-terminated unit of output (a tqdm redraw counts as one). Wall times
depend on what else the machine runs; "CPU" is the CPU seconds of the pipeline's processes, so
`lines / watch CPU s` is the rate lossguard itself sustains per core.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SRC = str(Path(__file__).resolve().parent.parent / "src")

# Ten lines a step; the two metrics lines are printed every `every`-th step, plain INFO lines otherwise.
CHILD = r'''
import sys
n, every = int(sys.argv[1]), int(sys.argv[2])
out, err = sys.stdout, sys.stderr
steps = n // 10
for i in range(1, steps + 1):
    pct = i * 100 // steps
    bar = "#" * (pct // 10)
    err.write("\r%3d%%|%-10s| %d/%d [01:23<01:41,  5.41it/s]" % (pct, bar, i, steps))
    err.write("\r%3d%%|%-10s| %d/%d [01:23<01:41,  5.42it/s]" % (pct, bar, i, steps))
    err.write("\r%3d%%|%-10s| %d/%d [01:24<01:40,  5.40it/s]" % (pct, bar, i, steps))
    if i % every == 0:
        print("{'loss': '%.4g', 'grad_norm': '%.4g', 'learning_rate': '%.4g', 'epoch': '%.4g'}"
              % (4.0 / (1 + i * 1e-4) + (i % 7) * 1e-3, 0.5 + (i % 13) * 0.05, 1e-4 * (1 - i / (steps + 1)),
                 i / 1000))
        print("[2026-01-01 12:00:00,000] [INFO] [logging.py:107:log_dist] [Rank 0] step=%d, skipped=0, "
              "lr=[%.6g], mom=[(0.9, 0.999)]" % (i, 1e-4 * (1 - i / (steps + 1))), file=err)
    else:
        print("[INFO|trainer.py:2301] 2026-01-01 12:00:00,000 >> gradient accumulation boundary %d" % i)
        print("[2026-01-01 12:00:00,000] [INFO] [engine.py:2100:step] micro batch %d done" % i, file=err)
    print("[2026-01-01 12:00:00,000] [INFO] [timer.py:264:stop] epoch=0/micro_step=%d/global_step=%d, "
          "RunningAvgSamplesPerSec=41.3, CurrSamplesPerSec=41.9, MemAllocated=1.2GB, MaxMemAllocated=3.4GB"
          % (i, i), file=err)
    print("[INFO|trainer.py:2345] 2026-01-01 12:00:00,000 >> Saving model checkpoint to out/checkpoint-%d" % i)
    print("  warnings.warn(  # torch/utils/checkpoint.py:91: UserWarning: None of the inputs", file=err)
    print("[rank1]: [2026-01-01 12:00:00,000] [WARNING] [stage_1_and_2.py:1863:step] tokens seen %d" % (i * 512))
    print("worker-1: data loader batch %d ready in 0.0%d s" % (i, i % 10))
'''
MIXES = {"typical": 10, "metrics": 1}  # mix -> metrics lines every N steps


def _run(cmd: str, env: dict) -> tuple[float, float]:
    """(wall s, CPU s of everything the pipeline ran)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, shell=True, check=True, env=env, executable="/bin/bash")
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _best(cmd: str, env: dict, repeat: int) -> tuple[float, float]:
    return min((_run(cmd, env) for _ in range(repeat)), key=lambda r: r[0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--mix", choices=[*MIXES, "both"], default="both")
    args = parser.parse_args()
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=SRC)
    py = sys.executable
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; {args.lines:,} lines per run, "
          f"best of {args.repeat}")
    with tempfile.TemporaryDirectory() as tmp:
        child = Path(tmp) / "child.py"
        child.write_text(CHILD)
        log = Path(tmp) / "watch.log"
        startup = _best(f"{py} -m lossguard watch -q -- {py} -c pass", env, args.repeat)
        print(f"watch start-up + report with an empty child: {startup[0]:.2f} s")
        for mix in MIXES if args.mix == "both" else [args.mix]:
            run_child = f"{py} {child} {args.lines} {MIXES[mix]}"
            alone = _best(f"{run_child} > /dev/null 2>&1", env, args.repeat)
            cat = _best(f"{run_child} 2>&1 | cat > /dev/null", env, args.repeat)
            watch = _best(f"{py} -m lossguard watch -q --log {log} -- {run_child} > /dev/null 2>/dev/null",
                          env, args.repeat)
            watch_cpu = watch[1] - alone[1]  # the child's own CPU is the same in every pipeline
            print(f"mix {mix}: {log.stat().st_size / 1e6:.0f} MB of output")
            for name, (wall, _) in (("child > /dev/null", alone), ("child | cat", cat), ("lossguard watch", watch)):
                print(f"  {name:<18} {wall:6.2f} s wall  {args.lines / wall / 1e3:7.0f}k lines/s")
            ratio = watch[0] / cat[0]
            rate = args.lines / watch[0]
            print(f"  watch / cat wall ratio {ratio:.2f}x; watch's own CPU {watch_cpu:.2f} s = "
                  f"{args.lines / max(watch_cpu, 1e-9) / 1e3:.0f}k lines per CPU-second")
            met = rate >= 100_000 and ratio <= 2.0
            print(f"  target >= 100k lines/s and <= 2x cat: {'met' if met else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
