"""Public API: `lossguard.analyze(paths)` -> Diagnosis. The CLI is a thin shell over this."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from pathlib import Path

from lossguard.core.engine import Engine
from lossguard.core.facts import RunFacts
from lossguard.core.records import Record
from lossguard.detectors import make_detectors
from lossguard.diagnose.diagnosis import Diagnosis, diagnose
from lossguard.sources import discover, records
from lossguard.sources.base import SourceError
from lossguard.sources.text_log import parse_stream


class NothingReadError(SourceError):
    pass


def analyze(paths: Iterable[str | Path], *, facts: RunFacts | None = None) -> Diagnosis:
    """Diagnose logs. `paths` may hold files, directories and "-" (stdin). Raises SourceError on bad input."""
    paths = [str(p) for p in paths]
    engine = Engine(make_detectors(), facts=facts)
    files = [p for p in paths if p != "-"]
    inputs = discover(files) if files else []
    stream: list[Iterable[Record]] = [records(inputs)]
    if "-" in paths:
        stream.append(parse_stream(sys.stdin.buffer, "<stdin>"))
    for part in stream:
        engine.feed_all(part)
    result = engine.finish()
    diagnosis = diagnose(result, inputs=[str(i.path) for i in inputs] + (["<stdin>"] if "-" in paths else []))
    stats = result.stats
    stepped = any(stats.events.get(name) for name in _TRAINING_EVENTS)
    if stats.num_train == 0 and stats.num_eval == 0 and not stepped and diagnosis.verdict == "healthy":
        # Nothing was trained in what we read: "healthy" would be a silently wrong answer.
        where = ", ".join(paths)
        crash = _crash_line([i.path for i in inputs])
        if crash:
            raise NothingReadError(f"{where}: the job crashed before logging any training metric ({crash}); "
                                   "fix that error first")
        raise NothingReadError(
            f"{where}: no training metrics or known log lines found; lossguard reads HF Trainer logs "
            "({'loss': ...} lines), trainer_state.json, TensorBoard events, DeepSpeed / Megatron / mmengine "
            "logs and JSONL/CSV with a step column (see `lossguard explain formats`)")
    return diagnosis


# Events only a running optimizer step prints: a log holding only these (DeepSpeed's loss-scaler lines)
# is a training log, not "nothing read".
_TRAINING_EVENTS = ("overflow", "scale-at-minimum", "nonfinite-detected")

_ERROR_LINE = re.compile(rb"^(?:\[rank\d+\]:\s*)?([A-Za-z_][\w.]*(?:Error|Exception)(?::[^\n]*)?)$", re.M)


def _crash_line(paths: list[Path]) -> str | None:
    """The last `SomethingError: message` line of a text log that holds a Python traceback."""
    for path in paths:
        try:
            with open(path, "rb") as handle:
                handle.seek(max(0, path.stat().st_size - (256 << 10)))
                tail = handle.read()
        except OSError:
            continue
        if b"Traceback (most recent call last)" not in tail:
            continue
        errors = [m.group(1) for m in _ERROR_LINE.finditer(tail)
                  if not m.group(1).startswith(b"torch.distributed.elastic")]
        if errors:
            return f"{path.name}: {errors[-1].decode('utf-8', 'replace')[:200]}"
    return None
