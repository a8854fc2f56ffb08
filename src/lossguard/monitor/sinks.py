"""Where live records and findings go: the console (rank 0), a JSONL file per rank, a webhook."""

from __future__ import annotations

import contextlib
import json
import math
import os
import queue
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from lossguard.core.findings import Finding, Severity
from lossguard.core.records import EVENTS_FILE, Record, event

FORMAT = "lossguard-events"
FORMAT_VERSION = 1


def _clean(value: Any) -> Any:
    """JSON-safe: non-finite floats become the strings "nan", "inf", "-inf"."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if isinstance(value, float):
        return value
    return str(value)


def record_line(record: Record) -> dict[str, Any]:
    line: dict[str, Any] = {"type": "record", "kind": record.kind, "step": record.step, "rank": record.rank}
    if record.event is not None:
        line["event"] = record.event
    if record.signals:
        line["signals"] = record.signals
    if record.data:
        line["data"] = record.data
    return _clean(line)


def finding_line(finding: Finding) -> dict[str, Any]:
    return _clean({"type": "finding", **finding.to_dict()})


def format_finding(finding: Finding) -> str:
    where = f"step {finding.step}" if finding.step is not None else "run"
    rank = f" rank {finding.rank}" if finding.rank is not None else ""
    sig = f" [{finding.signature}]" if finding.signature else ""
    return f"lossguard: {where}{rank}: {str(finding.severity).upper()} {finding.code}{sig} {finding.message}"


class JsonlSink:
    """`events-rank{r}.jsonl`, append-only; one `write()` per line on an unbuffered file, so a reader
    (or a crash) never sees a torn line.

    A sink that cannot write (disk full, permission, a vanished mount) says so once on stderr and switches
    itself off: a write error must neither raise into the training loop nor change what this rank
    analyses, or its halt decision could differ from the other ranks' and leave them waiting in a
    collective."""

    def __init__(self, directory: str | Path, rank: int, header: dict[str, Any]) -> None:
        self.path = Path(directory) / EVENTS_FILE.format(rank=rank)
        self.failed: str | None = None
        self._fd = -1
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as exc:
            self._give_up(exc)
        self.write({"type": "header", "format": FORMAT, "version": FORMAT_VERSION, "rank": rank,
                    "time": time.time(), **header})

    def write(self, obj: dict[str, Any]) -> None:
        if self._fd < 0:
            return
        data = (json.dumps(_clean(obj), separators=(",", ":")) + "\n").encode()
        try:
            written = os.write(self._fd, data)
            if written != len(data):  # a short write on a full disk: the line is torn, stop here
                raise OSError(f"short write ({written} of {len(data)} bytes)")
        except OSError as exc:
            self._give_up(exc)

    def _give_up(self, exc: OSError) -> None:
        self.failed = f"{type(exc).__name__}: {exc}"
        say(f"lossguard: cannot write events to {self.path} ({self.failed}); this rank's events file stops "
            f"here, live analysis and halting go on. Free space or point events_dir elsewhere.")
        self.close()

    def close(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1


def say(text: str) -> None:
    """A line on stderr that can never raise into training (stderr closed, a broken pipe). While a tqdm bar
    (the Trainer's, Lightning's) is drawn on stderr without its newline, the line goes through `tqdm.write`,
    which clears the bar, prints the line on its own and redraws the bar: a plain print would be glued onto
    the bar (`85.51it/s]lossguard: step 2 ...`)."""
    with contextlib.suppress(Exception):  # never raise into training, whatever tqdm does
        if _live_tqdm_bar():
            sys.modules["tqdm"].tqdm.write(text, file=sys.stderr)
            return
    with contextlib.suppress(OSError, ValueError):
        print(text, file=sys.stderr, flush=True)


def _live_tqdm_bar() -> bool:
    """A tqdm bar exists and draws on this stderr (tqdm imported by the job, never imported here)."""
    tqdm = sys.modules.get("tqdm")
    instances = getattr(getattr(tqdm, "tqdm", None), "_instances", None)
    return bool(instances) and any(getattr(bar, "fp", None) is not None and
                                   getattr(bar.fp, "_wrapped", bar.fp) in (sys.stderr, sys.__stderr__)
                                   for bar in list(instances))


class Webhook:
    """Slack-compatible JSON POST `{"text": ...}` from a daemon thread; training never waits on it."""

    def __init__(self, url: str, timeout_s: float = 5.0) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.errors = 0
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="lossguard-webhook", daemon=True)
        self._thread.start()

    def send(self, text: str) -> None:
        self._queue.put(text)

    def _run(self) -> None:
        while True:
            text = self._queue.get()
            if text is None:
                return
            try:
                body = json.dumps({"text": text}).encode()
                request = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    response.read()
            except Exception as exc:  # a dead webhook must not disturb training
                self.errors += 1
                if self.errors == 1:
                    print(f"lossguard: webhook {self.url} failed: {exc}", file=sys.stderr, flush=True)

    def close(self, wait_s: float = 5.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout=wait_s)


def at_least(finding: Finding, severity: str) -> bool:
    return finding.severity >= Severity.parse(severity)


def tell_unreadable(jsonl: Any, rank: int, console: bool, skipped: list[tuple[str, str]]) -> None:
    """Parameters the guard cannot read (name, why), left out of the update ratios, said once each: an
    `unreadable-tensors` event in this rank's own file (not its engine: the engines see the same records on
    every rank), a line on rank 0's console."""
    if not skipped:
        return
    if jsonl is not None:
        jsonl.write(record_line(event("unreadable-tensors", None, rank, params=[n for n, _ in skipped][:50],
                                      count=len(skipped), why=skipped[0][1])))
    if rank == 0 and console:
        more = ", ..." if len(skipped) > 1 else ""
        say(f"lossguard: {len(skipped)} parameter(s) left out of the update ratios, which this guard cannot "
            f"read ({skipped[0][0]}{more}: {skipped[0][1]}); training and the other signals are unaffected")


def announce_halt(monitor: Any, step: int, hits: list[Finding], hold: Any = None) -> None:
    """The halt, on every rank's events file and on rank 0's console (and webhook)."""
    codes = ", ".join(sorted({f"{f.code} ({f.signature or f.name})" for f in hits}))
    text = monitor.gate.console_line(hold) if hold is not None else \
        f"lossguard: halting at step {step} on every rank: {codes}"
    if monitor.jsonl is not None:
        monitor.jsonl.write({"type": "halt", "step": step, "codes": [f.code for f in hits],
                             **({"reason": "recovery-budget"} if hold is not None else {})})
    if monitor.rank == 0:
        say(text)
        if monitor.webhook is not None:
            monitor.webhook.send(text)
