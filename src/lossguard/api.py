"""Public API: `lossguard.analyze(paths)` -> Diagnosis. The CLI is a thin shell over this."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

from lossguard.core.engine import Engine
from lossguard.core.facts import RunFacts
from lossguard.core.records import Record
from lossguard.diagnose.diagnosis import Diagnosis, diagnose
from lossguard.sources import discover, records
from lossguard.sources.base import SourceError
from lossguard.sources.text_log import parse_stream


class NothingReadError(SourceError):
    pass


def analyze(paths: Iterable[str | Path], *, facts: RunFacts | None = None) -> Diagnosis:
    """Diagnose logs. `paths` may hold files, directories and "-" (stdin). Raises SourceError on bad input."""
    paths = [str(p) for p in paths]
    engine = Engine(facts=facts)
    files = [p for p in paths if p != "-"]
    inputs = discover(files) if files else []
    stream: list[Iterable[Record]] = [records(inputs)]
    if "-" in paths:
        stream.append(parse_stream(sys.stdin.buffer, "<stdin>"))
    for part in stream:
        engine.feed_all(part)
    result = engine.finish()
    if result.stats.num_train == 0 and result.stats.num_eval == 0 and not result.stats.events:
        where = ", ".join(paths)
        raise NothingReadError(
            f"{where}: no training metrics or known log lines found; lossguard reads HF Trainer logs "
            "({'loss': ...} lines), trainer_state.json, TensorBoard events, DeepSpeed / Megatron / mmengine "
            "logs and JSONL/CSV with a step column (see `lossguard explain formats`)")
    return diagnose(result, inputs=[str(i.path) for i in inputs] + (["<stdin>"] if "-" in paths else []))
