"""LineAssembler and LiveAnalyzer: pure, no processes."""

from __future__ import annotations

import random

import pytest

from lossguard.api import analyze
from lossguard.watch.analyzer import LiveAnalyzer
from lossguard.watch.lines import LineAssembler

DEAD = b"{'loss': '0', 'grad_norm': '0', 'learning_rate': '0.001', 'epoch': '%d'}\n"


def _feed_all(assembler: LineAssembler, chunks: list[bytes], redrawn: list | None = None) -> tuple[bytes, bytes]:
    logged, parsed = [], []
    for chunk in chunks:
        log, parse, redraws = assembler.push(chunk)
        logged.append(log)
        parsed.append(parse)
        if redrawn is not None and redraws:
            redrawn.append(redraws)
    log, parse = assembler.flush()
    return b"".join(logged) + log, b"".join(parsed) + parse


def test_any_chunking_gives_the_same_lines():
    data = b"".join(b"line %d %s\n" % (i, b"x" * (i % 50)) for i in range(500)) + b"tail without newline"
    rng = random.Random(0)
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(data)), 40))
        chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]
        log, parse = _feed_all(LineAssembler(), chunks)
        assert log == data and parse == data


def test_partial_lines_are_held_until_their_newline():
    assembler = LineAssembler()
    assert assembler.push(b"{'loss': '1.5', 'grad") == (b"", b"", b"")
    assert assembler.mid_line
    log, parse, _ = assembler.push(b"_norm': '0.3'}\nnext")
    assert log == parse == b"{'loss': '1.5', 'grad_norm': '0.3'}\n"
    assert assembler.flush() == (b"next", b"next")


def test_overlong_line_is_logged_whole_and_parsed_by_its_tail():
    cap = 1000
    assembler = LineAssembler(cap_bytes=cap)
    chunks = [b"\r 10%|#" * 100] * 30 + [b"{'loss': '2.0'}\nok\n"]
    log, parse = _feed_all(assembler, chunks, redrawn=[])
    assert log == b"".join(chunks)  # every byte reaches the log
    first, rest = parse.split(b"\n", 1)
    assert len(first) <= cap and first.endswith(b"{'loss': '2.0'}")
    assert rest == b"ok\n"
    assert len(assembler._pending) == 0


def test_memory_stays_bounded_without_newlines():
    assembler = LineAssembler(cap_bytes=4096)
    for _ in range(1000):
        assembler.push(b"x" * 1000)
        assert len(assembler._pending) <= 4096 + 1000 and len(assembler._spilled) <= 4096


def test_live_analyzer_alerts_once_and_flags_halt():
    analyzer = LiveAnalyzer(halt_on="broken")
    alerts = analyzer.feed(b"".join(DEAD % i for i in range(1, 6)))
    assert len(alerts) == 1
    alert = alerts[0]
    # One log with loss and grad_norm both exactly 0 is already a dead run: the alert comes at the first.
    assert alert.halt and alert.line_no == 1 and alert.step == 1
    assert alert.diagnosis.signature == "masked-labels"
    assert analyzer.feed(DEAD % 6) == []  # the same diagnosis is not announced twice
    assert analyzer.num_lines == 6


def test_live_analyzer_without_halt_on_never_halts():
    analyzer = LiveAnalyzer()
    alerts = analyzer.feed(b"".join(DEAD % i for i in range(1, 4)))
    assert alerts and not alerts[0].halt


def test_live_analyzer_rejects_a_bad_level():
    with pytest.raises(ValueError, match="halt_on"):
        LiveAnalyzer(halt_on="fatal")


def test_live_diagnosis_matches_analyze_on_the_same_log(tmp_path):
    """A finding seen live is reproduced by `analyze` on the watch log (DESIGN.md)."""
    lines = [b"\r 5%%|#  | %d/100 [00:01<00:09] {'loss': '%.3f', 'grad_norm': '0.9', 'learning_rate': '0.001', "
             b"'epoch': '0.%d'}\n" % (i, 4.0 - 0.1 * i, i) for i in range(1, 6)]
    lines += [b"{'loss': '0', 'grad_norm': 'nan', 'learning_rate': '0.001', 'epoch': '0.%d'}\n" % i
              for i in range(6, 10)]
    body = b"".join(lines)
    analyzer = LiveAnalyzer(halt_on="broken", source="watch.log")
    analyzer.feed(body)
    live = analyzer.finish(["watch.log"])
    path = tmp_path / "watch.log"
    path.write_bytes(body)
    offline = analyze([path])
    assert (live.verdict, live.signature, live.onset_step) == (offline.verdict, offline.signature,
                                                               offline.onset_step)
    assert [f.code for f in live.findings] == [f.code for f in offline.findings]


def test_deepspeed_progress_lines_are_read_and_timer_lines_skipped():
    analyzer = LiveAnalyzer()
    analyzer.feed(b"[2026-01-01 12:00:00,000] [INFO] [logging.py:107:log_dist] [Rank 0] step=10, skipped=0, "
                  b"lr=[0.001], mom=[(0.9, 0.999)]\n"
                  b"[2026-01-01 12:00:00,000] [INFO] [timer.py:264:stop] epoch=0/micro_step=10/global_step=10, "
                  b"RunningAvgSamplesPerSec=41.3\n")
    assert analyzer.engine.stats.num_train == 1
    assert analyzer.engine.stats.last_step == 10


BAR = (b"\rEpoch 0:  %d%%|#   | %d/40 [00:00<00:01, 18.0it/s, train_loss=%s]")


def _bar(values: list[str]) -> list[bytes]:
    """Lightning's tqdm bar as it reaches a pipe: a redraw per count (old postfix), one per new postfix."""
    chunks, last = [], None
    for i, value in enumerate(values, 1):
        chunks.append(BAR % (i * 100 // 40, i, last.encode()) if last else
                      b"\rEpoch 0:  2%%|#   | %d/40 [00:00<00:01, 18.0it/s]" % i)
        chunks.append(BAR % (i * 100 // 40, i, value.encode()))
        last = value
    return chunks


def test_a_progress_bar_is_parsed_redraw_by_redraw_before_its_line_ends():
    values = [f"{4 - i * 0.1:.3f}" for i in range(10)] + ["nan.0"] * 5
    assembler, redrawn = LineAssembler(), []
    log, parse = _feed_all(assembler, [*_bar(values), b"\n`Trainer.fit` stopped\n"], redrawn=redrawn)
    assert log == b"".join(_bar(values)) + b"\n`Trainer.fit` stopped\n"
    # Every redraw but the line's last reached the parser before the line ended; the rest came with it.
    assert len(redrawn) == 2 * len(values) - 1 and not any(b"\r" in r.strip(b"\r")[:1] for r in redrawn)
    assert parse.startswith(_bar(values)[-1].lstrip(b"\r")) and b"stopped" in parse


def test_the_live_analyzer_sees_a_nan_in_a_bar_when_it_is_printed():
    values = [f"{4 - i * 0.1:.3f}" for i in range(10)] + ["nan.0"] * 20
    analyzer, assembler = LiveAnalyzer(halt_on="broken"), LineAssembler()
    seen_at = None
    for i, chunk in enumerate(_bar(values)):
        log, parse, redraws = assembler.push(chunk)
        alerts = (analyzer.feed(parse) if parse else []) + \
            (analyzer.feed(redraws, complete=False, in_progress=True) if redraws else [])
        if any(a.halt for a in alerts) and seen_at is None:
            seen_at = alerts[0].diagnosis.onset_step, i // 2 + 1
    assert seen_at is not None, "the NaN was never seen while the bar was drawn"
    onset, printed_at = seen_at
    assert onset == 11 and printed_at <= 12  # caught within a redraw or two of the NaN's own
    assert analyzer.num_lines == 0  # the bar's line has not ended: no line was counted
