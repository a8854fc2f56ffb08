"""The live guard's own JSONL stream (`events-rank{r}.jsonl`, written by `lossguard.monitor`).

Records come back exactly as the live monitor fed them to its detectors, so `lossguard analyze
EVENTS_DIR` reproduces the live findings. Finding, halt and end lines are skipped: detectors recompute.
A `recovery` line (a step the commit gate held, monitor/recover.py) comes back as a "recovery" event
holding the line (`recovery`); the gathering takes it out of the stream for the report's `recoveries`,
so the detectors see exactly what they saw live (a held step never reached them).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

from lossguard.core.records import EVAL, EVENT, TRAIN, Record
from lossguard.sources.base import JSON, JSON_ERRORS, SourceError

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
                    obj = JSON.decode(text)
                except JSON_ERRORS:
                    continue
                if isinstance(obj, dict) and obj.get("type") == "record":
                    yield _record(obj, path.name, line_no)
                elif isinstance(obj, dict) and obj.get("type") == "recovery" and _int(obj.get("step")) is not None:
                    yield Record(step=obj["step"], rank=None, kind=EVENT, event="recovery", data=recovery(obj),
                                 source=path.name, line_no=line_no)


def _record(obj: dict, source: str, line_no: int) -> Record:
    """A record line as the live guard wrote it; a field of the wrong type (a damaged file) is dropped."""
    signals = obj.get("signals") if isinstance(obj.get("signals"), dict) else {}
    data = obj.get("data") if isinstance(obj.get("data"), dict) else {}
    kind = obj.get("kind") if obj.get("kind") in (TRAIN, EVAL, EVENT) else TRAIN
    event = obj.get("event") if isinstance(obj.get("event"), str) else None
    return Record(step=_int(obj.get("step")), rank=_int(obj.get("rank")), kind=kind, event=event,
                  signals={str(k): v for k, v in ((k, _float(v)) for k, v in signals.items()) if v is not None},
                  data=data, source=source, line_no=line_no)


def recovery(obj: dict) -> dict:
    """A recovery line as the report lists it (`recoveries`); a field of the wrong type becomes empty."""
    ranks = obj.get("ranks") if isinstance(obj.get("ranks"), list) else []
    samples = obj.get("samples") if isinstance(obj.get("samples"), list) else []
    text = {key: obj.get(key) if isinstance(obj.get(key), str) else None
            for key in ("kind", "signature", "code", "action")}
    return {"step": _int(obj.get("step")), "ranks": [r for r in ranks if _int(r) is not None],
            "kind": text["kind"], "samples": samples, "steps_lost": _int(obj.get("steps_lost")),
            "signature": text["signature"], "code": text["code"], "action": text["action"]}


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 10**15 else None


def _float(value: object) -> float | None:
    try:
        return float(_number(value))
    except (TypeError, ValueError, OverflowError):
        return None


def merged(paths: list[Path]) -> Iterator[Record]:
    """Several ranks' files as one stream in (step, rank) order, run-level events first."""
    import heapq

    def key(record: Record) -> tuple[int, int]:
        return (-1 if record.step is None else record.step, 0 if record.kind == "event" else 1)

    source = LossguardEventsSource()
    yield from heapq.merge(*(source.parse(p) for p in sorted(paths)), key=key)


def recoveries_in(paths: list[Path]) -> tuple[list[dict], int | None]:
    """The `recovery` lines of a run's events files, once per step (every rank writes each), in step order,
    and the first step the files hold a training record or a recovery of; only those lines are decoded (the
    others are skipped by a substring test)."""
    found: dict[int, dict] = {}
    first: int | None = None
    for path in paths:
        try:
            with open(path, "rb") as handle:
                for line in handle:
                    if first is None and b'"kind":"train"' in line:
                        first = _int(_decoded(line).get("step"))
                    if b'"type":"recovery"' not in line:
                        continue
                    try:
                        obj = JSON.decode(line.decode("utf-8", "replace"))
                    except JSON_ERRORS:
                        continue
                    if isinstance(obj, dict) and _int(obj.get("step")) is not None:
                        found.setdefault(obj["step"], recovery(obj))
        except OSError:
            continue
    steps = [s for s in (first, min(found, default=None)) if s is not None]
    return [found[step] for step in sorted(found)], min(steps, default=None)


def committed_losses(paths: list[Path], limit: int = 400) -> dict[int, list[float]]:
    """{step: every rank's loss} of the first `limit` steps' training records in a run's events files: what
    ties an events dir found beside a log to that log (the same losses at the same steps)."""
    losses: dict[int, list[float]] = {}
    for path in paths:
        try:
            with open(path, "rb") as handle:
                for line in handle:
                    if b'"kind":"train"' not in line:
                        continue
                    obj = _decoded(line)
                    step, signals = _int(obj.get("step")), obj.get("signals")
                    if step is None or not isinstance(signals, dict):
                        continue
                    loss = signals.get("loss")
                    if isinstance(loss, (int, float)) and math.isfinite(loss) and (step in losses or len(losses) < limit):
                        losses.setdefault(step, []).append(float(loss))
        except OSError:
            continue
    return losses


def _decoded(line: bytes) -> dict:
    try:
        obj = JSON.decode(line.decode("utf-8", "replace"))
    except JSON_ERRORS:
        return {}
    return obj if isinstance(obj, dict) else {}
