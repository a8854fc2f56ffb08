"""Public API: `lossguard.analyze(paths)` -> Diagnosis. The CLI is a thin shell over this."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from lossguard.core.engine import Engine
from lossguard.core.facts import RunFacts
from lossguard.core.findings import Finding, Severity
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
    diagnosis = diagnose(result, inputs=[i.label for i in inputs if i.label not in unread])
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
            f"{where}: no training metrics seen (no loss-like number and no known log line); lossguard reads "
            "HF Trainer logs ({'loss': ...} lines), trainer_state.json, TensorBoard events, MLflow / W&B runs, DeepSpeed / "
            "Megatron / mmengine logs and JSONL/CSV with a step column (see `lossguard explain formats`)")
    _mark_incomplete(diagnosis, gathering)
    return diagnosis


def _mark_incomplete(diagnosis: Diagnosis, gathering: Gathering) -> None:
    diagnosis.gathering = gathering
    mark_incomplete(diagnosis, gathering.incomplete_reasons())


def mark_incomplete(diagnosis: Diagnosis, reasons: list[str]) -> None:
    """Part of the input was not analysed: say so, as a warning-level finding (never a silent healthy).
    `diagnosis.incomplete` holds the reasons ([] when everything was analysed)."""
    diagnosis.incomplete = list(reasons)
    if not reasons:
        return
    diagnosis.findings.append(Finding(
        "SRC001", "analysis-incomplete", Severity.WARNING,
        "analysis incomplete: " + "; ".join(reasons) + "; the verdict covers what was read",
        data={"reasons": list(reasons)}))
    if diagnosis.verdict == "healthy":
        diagnosis.verdict = "warning"


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
