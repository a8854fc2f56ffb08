"""The live guard's own JSONL stream (`events-rank{r}.jsonl`, written by `lossguard.monitor`).

Records come back exactly as the live monitor fed them to its detectors, so `lossguard analyze
EVENTS_DIR` reproduces the live findings. Finding, halt and end lines are skipped: detectors recompute.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from lossguard.core.records import Record
from lossguard.sources.base import SourceError

_MARKER = b'"format":"lossguard-events"'


def _number(value: object) -> object:
    if isinstance(value, str) and value in ("nan", "inf", "-inf"):
        return float(value)
    return value


class LossguardEventsSource:
    name = "lossguard_events"

    def sniff(self, path: Path, head: bytes) -> bool:
        return head.lstrip().startswith(b"{") and _MARKER in head.split(b"\n", 1)[0]

    def parse(self, path: Path) -> Iterator[Record]:
        try:
            handle = open(path, encoding="utf-8")  # noqa: SIM115 - closed by the `with` below
        except OSError as exc:
            raise SourceError(f"{path}: cannot read ({exc.strerror})") from None
        with handle:
            for line_no, text in enumerate(handle, 1):
                if not text.endswith("\n"):
                    break  # a line still being written
                try:
                    obj = json.loads(text)
                except json.JSONDecodeError:
                    continue
                if obj.get("type") != "record":
                    continue
                yield Record(
                    step=obj.get("step"), rank=obj.get("rank"), kind=obj.get("kind", "train"),
                    event=obj.get("event"),
                    signals={k: float(_number(v)) for k, v in (obj.get("signals") or {}).items()},
                    data=obj.get("data") or {}, source=path.name, line_no=line_no,
                )


def merged(paths: list[Path]) -> Iterator[Record]:
    """Several ranks' files as one stream in (step, rank) order, run-level events first."""
    import heapq

    def key(record: Record) -> tuple[int, int]:
        return (-1 if record.step is None else record.step, 0 if record.kind == "event" else 1)

    source = LossguardEventsSource()
    yield from heapq.merge(*(source.parse(p) for p in sorted(paths)), key=key)
