"""How fast is `lossguard analyze` on a big log, next to `grep -c` on the same file?

Builds a realistic HF Trainer + DeepSpeed stdout log (DeepSpeed banner and config dump, per-step
timer/throughput INFO lines, tqdm progress lines, an HF log dict every 10 steps, `step=` lines,
occasional tokenization-mismatch warnings) of 1M lines, runs both commands as subprocesses, and prints
lines/s and the ratio; then the same for the log of a run that died early (loss 0.0 and grad_norm nan
from 10% on), the case lossguard exists for. Peak RSS is printed for 1M and 4M lines to show that memory
stays flat as the file grows.

    python bench/analyze_speed.py [--lines 1000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

HEADER = """\
[2026-11-01 10:00:00,000] [INFO] [real_accelerator.py:254:get_accelerator] Setting ds_accelerator to cuda (auto detect)
[2026-11-01 10:00:02,000] [INFO] [logging.py:107:log_dist] [Rank 0] DeepSpeed info: version=0.14.0, git-hash=unknown, git-branch=unknown
[2026-11-01 10:00:03,000] [INFO] [config.py:1003:print]   bfloat16_enabled ............. True
[2026-11-01 10:00:03,000] [INFO] [config.py:1003:print]   communication_data_type ...... None
[2026-11-01 10:00:03,000] [INFO] [config.py:1003:print]   zero_config .................. stage=2 contiguous_gradients=True reduce_scatter=True reduce_bucket_size=200000000 use_multi_rank_bucket_allreduce=True overlap_comm=True
"""


def build_log(path: Path, num_lines: int, seed: int = 0, dead_from: float | None = None) -> None:
    """`dead_from`: the fraction of the log after which the run is dead (the HF dict shows loss 0.0 and
    grad_norm nan: the NaN filter artefact), as in the six-hour logs lossguard is for."""
    rng = random.Random(seed)
    written = 0
    step = 0
    loss = 2.5
    total = num_lines // 4
    with open(path, "w") as out:
        out.write(HEADER)
        written += HEADER.count("\n")
        while written < num_lines:
            step += 1
            loss = max(0.3, loss * 0.9999 + rng.uniform(-0.01, 0.01))
            rate = 1.2 + rng.random()
            lines = [
                f"[2026-11-01 10:{step // 60 % 60:02d}:{step % 60:02d},123] [INFO] [timer.py:264:stop] "
                f"epoch=0/micro_step={step}/global_step={step}, RunningAvgSamplesPerSec={rate * 8:.3f}, "
                f"CurrSamplesPerSec={rate * 8:.3f}, MemAllocated=13.2GB, MaxMemAllocated=21.0GB",
                f"{100 * step // total:3d}%|###       | {step}/{total} [01:{step % 60:02d}<10:00, {rate:.2f}it/s]",
                "[2026-11-01 10:00:00,000] [INFO] [logging.py:107:log_dist] [Rank 0] time (ms) | fwd: 120.1 | "
                "bwd: 240.2 | bwd_inner: 230.1 | bwd_allreduce: 10.0 | step: 30.3",
            ]
            if step % 10 == 0 and dead_from is not None and written > dead_from * num_lines:
                lines.append(f"{{'loss': 0.0, 'grad_norm': nan, 'learning_rate': 1e-05, 'epoch': {step / total:.4f}}}")
            elif step % 10 == 0:
                lines.append(f"{{'loss': {loss:.4f}, 'grad_norm': {rng.uniform(0.5, 2):.4f}, "
                             f"'learning_rate': 1e-05, 'epoch': {step / total:.4f}}}")
                lines.append(f"[2026-11-01 10:00:00,000] [INFO] [logging.py:107:log_dist] [Rank 0] "
                             f"step={step}, skipped=0, lr=[1e-05, 1e-05], mom=[(0.9, 0.999), (0.9, 0.999)]")
            if step % 997 == 0:
                lines.append("WARNING: tokenization mismatch: 512 vs. 509. (ignored)")
            out.write("\n".join(lines) + "\n")
            written += len(lines)


def build_dense_log(path: Path, num_lines: int, seed: int = 0) -> None:
    """A multi-node run that logs every step: per step a tqdm line, a DeepSpeed `step=` line and the
    transformers-5 log dict (quoted values) printed once per node with the node's address in front."""
    rng = random.Random(seed)
    written, step, loss = 0, 0, 2.5
    total = num_lines // 4
    with open(path, "w") as out:
        out.write(HEADER)
        written += HEADER.count("\n")
        while written < num_lines:
            step += 1
            loss = max(0.3, loss * 0.9999 + rng.uniform(-0.01, 0.01))
            logged = (f"{{'loss': '{loss:.4f}', 'grad_norm': '{rng.uniform(0.5, 2):.4f}', "
                      f"'learning_rate': '1e-05', 'epoch': '{step / total:.4f}'}}")
            lines = [
                f"{100 * step // total:3d}%|###       | {step}/{total} [01:{step % 60:02d}<10:00,  1.50it/s]",
                f"[2026-11-01 10:00:00,000] [INFO] [logging.py:107:log_dist] [Rank 0] "
                f"step={step}, skipped=0, lr=[1e-05, 1e-05], mom=[(0.9, 0.999), (0.9, 0.999)]",
                f"10.0.0.1: {logged}",
                f"10.0.0.2: {logged}",
            ]
            out.write("\n".join(lines) + "\n")
            written += len(lines)


def parse_only_s(path: Path) -> tuple[float, int]:
    """(seconds, records) to iterate the parser's records in this process, without the detectors."""
    import gc

    from lossguard.sources import discover, records

    gc.freeze()  # as `lossguard analyze` does: the cyclic collector would time itself, not the parser
    start = time.perf_counter()
    count = sum(1 for _ in records(discover([str(path)])))
    return time.perf_counter() - start, count


def handover_s(path: Path) -> float:
    """Seconds for Python to take grep's lines one by one and do nothing with them: the least any per-line
    parser in this interpreter pays."""
    from lossguard.sources.scan import iter_grep_lines

    start = time.perf_counter()
    for _ in iter_grep_lines(path):
        pass
    return time.perf_counter() - start


def engine_only_s(path: Path) -> float:
    """Seconds for the detectors alone over the log's records, parsed beforehand."""
    from lossguard.core.engine import Engine
    from lossguard.detectors import make_detectors
    from lossguard.sources import discover, records

    parsed = list(records(discover([str(path)])))
    start = time.perf_counter()
    engine = Engine(make_detectors())
    engine.feed_all(parsed)
    engine.finish()
    return time.perf_counter() - start


def _child_env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    # An installed package has its bytecode compiled (pip does it); a sandbox that sets
    # PYTHONDONTWRITEBYTECODE would make every run recompile lossguard, timing the compiler.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def timed(cmd: list[str]) -> tuple[float, int]:
    """(wall seconds, peak RSS in MiB) of one child process."""
    start = time.perf_counter()
    # stdout goes to a pipe we drain, never to /dev/null: GNU grep notices /dev/null and stops at
    # its first match, which would time nothing.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_child_env())
    proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) not in (0, 1):
        sys.exit(f"command failed: {' '.join(cmd)}\n{proc.stderr.read().decode()}")
    return wall, usage.ru_maxrss // 1024


def best(cmd: list[str], repeat: int) -> tuple[float, int]:
    timed(cmd)  # warm-up, not counted: the file in the page cache, lossguard's bytecode compiled
    runs = [timed(cmd) for _ in range(repeat)]
    return min(r[0] for r in runs), max(r[1] for r in runs)


def anchor_scan_cmd(path: Path) -> list[str]:
    """The scan `analyze` starts with: grep over every anchor the parsers need, as sources/scan.py runs it."""
    from lossguard.sources.scan import GREP_OPTIONS

    return ["env", "LC_ALL=C", "grep", *GREP_OPTIONS, "--", str(path)]


def main() -> None:
    sys.path.insert(0, str(ROOT / "src"))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    analyze = [sys.executable, "-m", "lossguard", "analyze", "--format", "json", "--fail-on", "never"]
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "train.log"
        build_log(log, args.lines)
        size_mb = log.stat().st_size / 1e6
        grep_s, _ = best(["grep", "-c", "loss", str(log)], args.repeat)
        ours_s, rss_1 = best([*analyze, str(log)], args.repeat)
        print(f"log: {args.lines:,} lines, {size_mb:.0f} MB")
        print(f"grep -c          : {grep_s:7.3f} s  {args.lines / grep_s:>12,.0f} lines/s")
        print(f"lossguard analyze: {ours_s:7.3f} s  {args.lines / ours_s:>12,.0f} lines/s")
        print(f"ratio analyze / grep: {ours_s / grep_s:.2f}x  (target <= 5x)")
        dead = Path(tmp) / "dead.log"
        build_log(dead, args.lines, dead_from=0.1)
        dead_grep_s, _ = best(["grep", "-c", "loss", str(dead)], args.repeat)
        dead_s, _ = best([*analyze, str(dead)], args.repeat)
        print(f"same log, dead (loss 0.0, grad_norm nan) after its first 10%: analyze {dead_s:.3f} s, "
              f"grep -c {dead_grep_s:.3f} s: {dead_s / dead_grep_s:.2f}x")
        big = Path(tmp) / "train4x.log"
        build_log(big, 4 * args.lines)
        _, rss_4 = best([*analyze, str(big)], 1)
        dense = Path(tmp) / "dense.log"
        build_dense_log(dense, args.lines)
        dense_grep_s, _ = best(["grep", "-c", "loss", str(dense)], args.repeat)
        dense_s, rss_dense = best([*analyze, str(dense)], args.repeat)
        print(f"dense multi-node log (tqdm + step= + two node-prefixed quoted dicts every step): analyze "
              f"{dense_s:.3f} s, grep -c {dense_grep_s:.3f} s: {dense_s / dense_grep_s:.2f}x, peak RSS {rss_dense} MiB")
        # What no parser work can go below: the anchor scan (it runs beside the parser, on the other core)
        # and the interpreter with lossguard's imports.
        startup_s, _ = best([sys.executable, "-c", "import lossguard.cli.main, lossguard.api"], args.repeat)
        for name, path, base in (("bench log", log, grep_s), ("dense log", dense, dense_grep_s)):
            scan_s, _ = best(anchor_scan_cmd(path), args.repeat)
            print(f"floor ({name}): anchor scan {scan_s:.3f} s ({scan_s / base:.2f}x grep -c) + start-up "
                  f"{startup_s:.3f} s ({startup_s / base:.2f}x) = {(scan_s + startup_s) / base:.2f}x before any line is parsed")
        for name, path in (("bench log", log), ("dense log", dense)):
            parse_s, count = min(parse_only_s(path) for _ in range(args.repeat))
            print(f"parse only ({name}, in-process, no detectors): {parse_s:.3f} s, {count:,} records")
        for name, path, base in (("bench log", log, grep_s), ("dense log", dense, dense_grep_s)):
            hand = min(handover_s(path) for _ in range(args.repeat))
            engine = min(engine_only_s(path) for _ in range(args.repeat))
            print(f"python floor ({name}): grep's lines handed to Python, nothing done {hand:.3f} s "
                  f"({hand / base:.2f}x grep -c); the detectors alone over its records {engine:.3f} s "
                  f"({engine / base:.2f}x)")
        print(f"peak RSS: {rss_1} MiB at {args.lines:,} lines, {rss_4} MiB at {4 * args.lines:,} lines")


if __name__ == "__main__":
    main()
