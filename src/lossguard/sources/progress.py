"""The training progress bar's position: the step a line shows when nothing else on it names one.

The HF Trainer draws tqdm's bar with no description, ` 14%|█▍        | 379/2724 [14:00:21<86:09:52, 132.28s/it]`:
379 of 2724 optimizer steps are done. What the job prints while that bar is up (a DeepSpeed OVERFLOW line,
the Trainer's "tried to get lr value" warning) lands on the bar's line, and a log dict printed next is the
log of step 379. A log that names no step of its own is then placed on the run's real steps instead of
being numbered 1, 2, 3: a storm of overflows hours into a run sits at its real step, not at the start-up
where a few overflows are the loss scale's normal calibration.

Only a bar with no description counts: `Map:  14%|...| 7000/52002 [`, `Epoch 0:  3%|...| 565/20101 [` and
the like count samples or batches of an epoch, not optimizer steps. What a launcher or a paste put before
the line (`[rank0]:`, `10.0.0.1: `, a timestamp) is no description. A bar at its end (N == M) is a finished
pass (a data-loading bar), never the position of a running training loop.
"""

from __future__ import annotations

from lossguard.sources.patterns import TQDM_COUNTER
from lossguard.sources.readers.generic import TQDM_END, past_prefix


def bar_step(line: bytes, end: int | None = None) -> int | None:
    """N of the last running training bar (no description, N < M) before `end`; None when there is none."""
    end = len(line) if end is None else end
    if line.find(b"%|", 0, end) < 0:  # most event lines carry no bar: one memchr-speed test
        return None
    counters = list(TQDM_COUNTER.finditer(line, 0, end))
    if not counters:
        return None
    counter = counters[-1]
    done, total = int(counter.group(1)), int(counter.group(2))
    if not 0 < done < total:
        return None
    # `14%|█▍   | 379/2724 [`: the percentage, the bar between two pipes, then the counter.
    close = line.rfind(b"|", 0, counter.start())
    opened = line.rfind(b"%|", 0, close) if close > 0 else -1
    if opened < 0 or line.find(b"|", opened + 2, close) >= 0:
        return None
    digits = opened
    while digits > 0 and line[digits - 1:digits].isdigit():
        digits -= 1
    # Where this redraw began: the line's start, a carriage return, or the end of the redraw before it.
    begin = max(line.rfind(b"\r", 0, digits) + 1, _last_redraw_end(line, digits))
    head = line[past_prefix(line, begin, digits):digits]
    return done if not head.strip() else None


def _last_redraw_end(line: bytes, before: int) -> int:
    at = 0
    for match in TQDM_END.finditer(line, 0, before):
        at = match.end()
    return at
