"""How much of `analyze` is the engine? Parses the speed bench's log once into records, then times
feeding them to an engine with `feed_all` and one record at a time with `feed`, next to the parse.

    python bench/engine_share.py [--lines 1000000] [--repeat 3] [--dead]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from analyze_speed import build_log  # noqa: E402

from lossguard.core.engine import Engine  # noqa: E402
from lossguard.detectors import make_detectors  # noqa: E402
from lossguard.sources import discover, records  # noqa: E402


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dead", action="store_true", help="the log that dies after its first 10%%")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "train.log"
        build_log(log, args.lines, dead_from=0.1 if args.dead else None)
        parse_s = best(lambda: list(records(discover([str(log)]))), args.repeat)
        stream = list(records(discover([str(log)])))

    def feed_all():
        engine = Engine(make_detectors())
        engine.feed_all(stream)
        engine.finish()

    def feed_each():
        engine = Engine(make_detectors())
        for record in stream:
            engine.feed(record)
        engine.finish()

    all_s, each_s = best(feed_all, args.repeat), best(feed_each, args.repeat)
    print(f"{len(stream):,} records from {args.lines:,} lines")
    print(f"parse: {parse_s:.3f} s  feed_all: {all_s:.3f} s ({all_s / parse_s:.2f}x parse)  "
          f"feed one by one: {each_s:.3f} s ({each_s / parse_s:.2f}x parse)")


if __name__ == "__main__":
    main()
