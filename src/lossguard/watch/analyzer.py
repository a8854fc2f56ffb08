"""The live side of `watch`: whole output lines in, a live diagnosis and a halt decision out.

The same parser (`TextLogParser`), anchor pre-filter (`patterns.ANCHORS`, via `iter_lines`) and detectors
(`Engine`) as `analyze`, so `lossguard analyze watch.log` afterwards reaches the same diagnosis. Per line
the cost is one regex scan over the chunk; only anchor-bearing lines are parsed, and only a new finding
triggers a (cheap) diagnosis of the engine's snapshot.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

from lossguard.core.engine import Engine
from lossguard.core.facts import RunFacts
from lossguard.core.findings import Severity
from lossguard.core.records import Record
from lossguard.detectors import make_detectors
from lossguard.diagnose.diagnosis import Diagnosis, diagnose
from lossguard.sources.scan import iter_lines
from lossguard.sources.text_log import TextLogParser
from lossguard.watch.lines import MAX_LINE_BYTES

# How bad a verdict is, for `--halt-on`.
VERDICT_RANK = {"healthy": 0, "warning": 1, "broken": 2}


@dataclass(slots=True)
class Alert:
    """A new live diagnosis worth a banner: the verdict got worse or a new signature appeared."""

    diagnosis: Diagnosis
    line_no: int  # the output line that revealed it (line number in the watch log)
    step: int | None  # the last training step seen when it was revealed
    halt: bool  # the verdict is at or above --halt-on


class LiveAnalyzer:
    def __init__(self, *, halt_on: str | None = None, source: str = "watch", facts: RunFacts | None = None,
                 cap_bytes: int = MAX_LINE_BYTES) -> None:
        if halt_on is not None and halt_on not in VERDICT_RANK:
            raise ValueError(f"halt_on={halt_on!r}; use one of: broken, warning")
        self.halt_on = halt_on
        self.source = source
        self.cap_bytes = cap_bytes
        self.engine = Engine(make_detectors(), facts=facts)
        self.parser = TextLogParser(source)
        self.num_lines = 0  # lines seen so far, over both streams: line numbers in the watch log
        self._announced: set[tuple[str, str | None]] = set()
        self._worst = 0
        self.cut_lines = 0  # lines longer than cap_bytes, read by their last part (the report says so)
        self._waiting: tuple | None = None  # a halt waiting for its finding to settle (`_only_settling`)

    def feed(self, body: bytes, *, complete: bool = True, in_progress: bool = False) -> list[Alert]:
        """Whole lines (`body` ends with a newline unless `complete` is False: the last, unterminated one),
        or, `in_progress`, the redraws of the line being written (a progress bar): parsed as that line,
        which is counted when it ends."""
        alerts: list[Alert] = []
        base = self.num_lines
        records: list[Record] = []
        where: dict[int, tuple[int, int | None]] = {}  # id(record) -> (its line, the parser's step after it)
        for line_no, line in iter_lines(io.BytesIO(body)):
            if len(line) > self.cap_bytes:
                line = line[-self.cap_bytes:]
                self.cut_lines += 1
            for record in self.parser.parse_line(line, base + line_no):
                if self.parser.recovered and not self.parser.kept(record):
                    continue  # the attempt of a step the guard recovered (its line came first): never applied
                records.append(record)
                where[id(record)] = (base + line_no, self.parser.last_step)

        def on_findings(record: Record, new: list) -> None:
            if any(f.severity >= Severity.WARNING for f in new):
                alert = self._assess(*where[id(record)])
                if alert is not None:
                    alerts.append(alert)

        # The chunk's records in one go: the batch path (analyze's speed), alerts placed at their line.
        self.engine.feed_all(records, on_findings)
        if self._waiting is not None:
            alerts.extend(self._settled(base + body.count(b"\n")))
        if not in_progress:
            self.num_lines = base + body.count(b"\n") + (0 if complete or body.endswith(b"\n") else 1)
        return alerts

    def finish(self, inputs: list[str], incomplete: list[str] | None = None) -> Diagnosis:
        return diagnose(self.engine.finish(), inputs=inputs, incomplete=incomplete,
                        recoveries=self.parser.recoveries)

    def snapshot(self) -> Diagnosis:
        return diagnose(self.engine.snapshot(), inputs=[self.source], recoveries=self.parser.recoveries)

    def _assess(self, line_no: int, step: int | None) -> Alert | None:
        diagnosis = self.snapshot()
        key = (diagnosis.verdict, diagnosis.signature)
        rank = VERDICT_RANK[diagnosis.verdict]
        if rank == 0 or key in self._announced:
            return None
        if rank < self._worst and diagnosis.signature is None:
            return None
        self._announced.add(key)
        self._worst = max(self._worst, rank)
        halt = self.halt_on is not None and rank >= VERDICT_RANK[self.halt_on]
        if halt and self._waiting is None and (waiting := self._only_settling(diagnosis)) is not None:
            # A finding a later column may still refute (a divergence that is harder data): the banner now,
            # the halt once its logs have had their say (`Detector.settle_logs`, as the live guard does).
            self._waiting = (*waiting, self.engine.stats.num_train, step)
            halt = False
        return Alert(diagnosis, line_no, step, halt)

    def _only_settling(self, diagnosis: Diagnosis) -> tuple | None:
        """(the finding, its detector) when the verdict rests on one finding whose detector waits for the
        logs after it before a halt (`settle_logs`); None when anything else calls the run broken."""
        bad = [f for f in diagnosis.findings if f.severity >= Severity.ERROR]
        detectors = {d.code: d for d in self.engine.detectors}
        if len(bad) != 1 or getattr(detectors.get(bad[0].code), "settle_logs", 0) <= 0:
            return None
        return bad[0], detectors[bad[0].code]

    def _settled(self, line_no: int) -> list[Alert]:
        """The waiting halt once its detector's logs have passed: an alert that halts, or (the logs refuted
        the finding) none, the finding demoted with the reason as `analyze` does."""
        finding, detector, logs_then, step = self._waiting
        if self.engine.stats.num_train - logs_then < detector.settle_logs:
            return []
        self._waiting = None
        if detector.contradiction() is not None:
            detector.review()
            return []
        return [Alert(self.snapshot(), line_no, self.parser.last_step, True)]
