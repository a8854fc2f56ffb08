"""What probe reads from one arm: its diagnosis and, when the job crashed, the crash's own error line. Pure:
no torch import.

An arm is read from two sources: the job's output (`stdout.log`) and the guard's per-rank events. Both can
carry a number called a weight fingerprint, and they are different quantities: the guard's is a
position-weighted sum of parameter norms, a script's own `param_sum` line is a plain sum. The rank-desync
check compares one rank's value with another's at the same step, so a plain sum on rank 1 measured against
the guard's norm sum on rank 0 reads as replicas out of sync on a healthy run. When the guard's events are
there, they are the arm's fingerprints, the same quantity on every rank; the job's printed one is dropped
before the detectors see it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from lossguard.core.records import from_the_guard

FINGERPRINT = "param_fingerprint"

# `SomethingError: message` (or `...Exception`), optionally behind torchrun's `[rankN]:` prefix.
_ERROR_LINE = re.compile(r"^(?:\[rank\d+\]:\s*)?((?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception)\b(?::.*)?)$")
_RANK_PREFIX = re.compile(r"^\[rank\d+\]:\s*")
_TAIL_BYTES = 256 << 10


def diagnose_arm(stdout_path: Path, events_dir: Path) -> Any:
    """`lossguard analyze` over the arm's stdout and the guard's events, fingerprints from the guard alone
    when it left events; None when nothing could be read."""
    from lossguard.core.engine import Engine
    from lossguard.detectors import make_detectors
    from lossguard.diagnose.diagnosis import diagnose
    from lossguard.sources import discover, records
    from lossguard.sources.base import SourceError
    from lossguard.sources.gather import Gathering

    guarded = events_dir.is_dir() and any(events_dir.glob("events-rank*.jsonl"))
    paths = [str(stdout_path)] + ([str(events_dir)] if guarded else [])
    engine = Engine(make_detectors())
    gathering = Gathering()
    try:
        inputs = discover(paths, gathering)
        stream = records(inputs, gathering)
        engine.feed_all(_guard_fingerprints_only(stream) if guarded else stream)
    except SourceError:
        return None
    finally:
        gathering.close()
    result = engine.finish()
    unread = {why.split(": ", 1)[0] for why in gathering.unread}
    return diagnose(result, inputs=[i.label for i in inputs if i.label not in unread],
                    incomplete=gathering.incomplete_reasons(), gathering=gathering)


def _guard_fingerprints_only(stream: Iterable[Any]) -> Iterator[Any]:
    """Every record, with the fingerprint kept only on the guard's own: a record from the job's output
    loses its printed `param_sum`."""
    for record in stream:
        if FINGERPRINT in record.signals and not from_the_guard(record):
            record.signals = {k: v for k, v in record.signals.items() if k != FINGERPRINT}
        yield record


def crash_line(paths: Iterable[Path]) -> str | None:
    """The crash's own error line: the last `SomethingError: message` line of the job's output, leaving out
    the launcher's report of it (torch.distributed.elastic...). A message that ends at its `:` (pydantic's
    `1 validation error for X`, a multi-line message) gets its next lines, up to 3, joined with ` | `."""
    for path in paths:
        lines = _tail_lines(Path(path))
        found = None
        for i, line in enumerate(lines):
            match = _ERROR_LINE.match(line.strip())
            if match and not match.group(1).startswith("torch.distributed.elastic"):
                found = i, match.group(1)
        if found is not None:
            return _with_detail(lines, *found)[:300]
    return None


def _tail_lines(path: Path) -> list[str]:
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, path.stat().st_size - _TAIL_BYTES))
            return handle.read().decode("utf-8", "replace").replace("\r", "\n").splitlines()
    except OSError:
        return []


def _with_detail(lines: list[str], index: int, text: str) -> str:
    """pydantic's ValidationError puts the field and the reason on the lines after the exception line."""
    if "validation error" not in text and not text.endswith(":"):
        return text
    detail = []
    for line in lines[index + 1:index + 4]:
        line = _RANK_PREFIX.sub("", line).strip()
        if not line or line.startswith(("For further information", "Traceback", "[")):
            break
        detail.append(line)
    return " | ".join([text, *detail]) if detail else text
