"""`watch` and `analyze` are one diagnosis: the output of a run read live, chunk by chunk as a pipe delivers
it (progress bars redrawn with carriage returns read redraw by redraw), and the same output read afterwards
give the same verdict, signature and onset. Over the fault zoo's real runs and real Lightning runs (tqdm and
rich bars; tests/fixtures/lightning, written by scripts/make_lightning_logs.py)."""

import random
from pathlib import Path

import pytest

from lossguard.api import analyze
from lossguard.watch.analyzer import LiveAnalyzer
from lossguard.watch.lines import LineAssembler

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LOGS = sorted([*(FIXTURES / "real").glob("*/stdout.log"), *(FIXTURES / "lightning").glob("*.log")])


def read_live(data: bytes, seed: int) -> tuple:
    """What `watch` does with the bytes of one stream (watch/process.py): random chunks through the line
    assembler, whole lines and the redraws of the line in progress into the live analyzer."""
    rng, assembler, analyzer = random.Random(seed), LineAssembler(), LiveAnalyzer(source="watch.log")
    at = 0
    while at < len(data):
        size = rng.choice((1, 7, 64, 512, 4096, 65536))
        log, parse, redraws = assembler.push(data[at:at + size])
        at += size
        if parse:
            analyzer.feed(parse)
        if redraws:
            analyzer.feed(redraws, complete=False, in_progress=True)
    _, parse = assembler.flush()
    if parse:
        analyzer.feed(parse, complete=False)
    return analyzer.finish(["watch.log"])


@pytest.mark.parametrize("path", LOGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_live_and_offline_reach_the_same_diagnosis(path):
    offline = analyze([str(path)])
    for seed in range(3):
        live = read_live(path.read_bytes(), seed)
        assert (live.verdict, live.signature, live.onset_step) == \
            (offline.verdict, offline.signature, offline.onset_step), (seed, [f.message for f in live.findings])


def test_the_set_holds_the_lightning_runs_and_the_zoo():
    assert len([p for p in LOGS if p.parent.name == "lightning"]) == 4 and len(LOGS) > 20
