"""Public API: `lossguard.analyze(paths)` -> Diagnosis. The CLI is a thin shell over this."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from lossguard.core.engine import Engine
from lossguard.core.facts import RunFacts
from lossguard.detectors import make_detectors
from lossguard.diagnose.diagnosis import Diagnosis, diagnose
from lossguard.sources import discover, records
from lossguard.sources.base import SourceError
from lossguard.sources.gather import Gathering


class NothingReadError(SourceError):
    pass


def analyze(paths: Iterable[str | Path], *, facts: RunFacts | None = None) -> Diagnosis:
    """Diagnose logs. `paths` may hold files, directories, pipes and "-" (stdin). Raises SourceError on bad
    input. The diagnosis carries `gathering` (files used and skipped) and `incomplete` (reasons, or [])."""
    paths = [str(p) for p in paths]
    engine = Engine(make_detectors(), facts=facts)
    gathering = Gathering()
    try:
        inputs = discover(paths, gathering)
        engine.feed_all(records(inputs, gathering))
    finally:
        gathering.close()
    result = engine.finish()
    unread = {why.split(": ", 1)[0] for why in gathering.unread}
    diagnosis = diagnose(result, inputs=[i.label for i in inputs if i.label not in unread],
                         incomplete=gathering.incomplete_reasons(), gathering=gathering)
    if diagnosis.nothing_to_judge:
        where = ", ".join(paths)
        crash = _crash_line([i.path for i in inputs])
        if crash:
            raise NothingReadError(f"{where}: the job crashed before logging any training metric ({crash}); "
                                   "fix that error first")
        raise NothingReadError(
            f"{where}: no training metrics seen (no loss-like number and no known log line); lossguard reads "
            "HF Trainer logs ({'loss': ...} lines), trainer_state.json, TensorBoard events, MLflow / W&B runs, DeepSpeed / "
            "Megatron / mmengine logs and JSONL/CSV with a step column (see `lossguard explain formats`)")
    return diagnosis


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
