"""`lossguard watch -- COMMAND`: run a training command, pass its output through, diagnose it live, stop it
when it dies, and write the same report `analyze` writes.

    from lossguard.watch import watch
    result = watch(["torchrun", "--nproc_per_node", "2", "train.py"], halt_on="broken", report_dir="out/")
    result.exit_code, result.diagnosis.signature
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from lossguard.diagnose.diagnosis import Diagnosis
from lossguard.watch.analyzer import LiveAnalyzer
from lossguard.watch.oshelpers import exit_code_for
from lossguard.watch.outcome import (
    EXIT_HALTED,
    EXIT_NOT_EXECUTABLE,
    EXIT_NOT_FOUND,
    WatchConfig,
    WatchOutcome,
)
from lossguard.watch.process import Watcher

__all__ = ["EXIT_HALTED", "EXIT_NOT_EXECUTABLE", "EXIT_NOT_FOUND", "WatchResult", "exit_code_for", "watch"]

LOG_NAME = "watch.log"


@dataclass
class WatchResult:
    outcome: WatchOutcome
    diagnosis: Diagnosis
    log_path: Path | None
    report_paths: list[Path]

    @property
    def exit_code(self) -> int:
        return self.outcome.exit_code

    def to_dict(self) -> dict:
        """The `analyze --format json` contract plus a `watch` block (command, exit status, signals sent)."""
        report = self.diagnosis.to_dict()
        report["incomplete"] = list(self.diagnosis.incomplete)
        report["watch"] = self.outcome.to_dict()
        return report


def watch(command: list[str], *, halt_on: str | None = None, grace_s: float = 10.0,
          report_dir: str | Path | None = None, log_path: str | Path | None = None,
          unbuffered: bool = True, env: dict[str, str] | None = None, color: bool | None = None) -> WatchResult:
    """Run `command` under watch. Raises FileNotFoundError / PermissionError if it cannot be started."""
    report_dir = Path(report_dir) if report_dir is not None else None
    if report_dir is not None:
        report_dir.mkdir(parents=True, exist_ok=True)
    if log_path is None and report_dir is not None:
        log_path = report_dir / LOG_NAME
    log_path = Path(log_path) if log_path is not None else None
    source = log_path.name if log_path is not None else "<watch>"
    config = WatchConfig(command=list(command), halt_on=halt_on, grace_s=grace_s, log_path=log_path,
                         unbuffered=unbuffered, env=env, color=color)
    watcher = Watcher(config, LiveAnalyzer(halt_on=halt_on, source=source))
    analyzer = watcher.analyzer
    outcome = watcher.run()
    diagnosis = analyzer.finish(inputs=[str(log_path) if log_path is not None else "<watch>"],
                                incomplete=_incomplete_reasons(outcome, analyzer))
    result = WatchResult(outcome, diagnosis, log_path, [])
    if report_dir is not None:
        result.report_paths = write_reports(result, report_dir, command)
    return result


def _incomplete_reasons(outcome, analyzer: LiveAnalyzer) -> list[str]:
    reasons = []
    if outcome.cut_lines:
        reasons.append(f"{outcome.cut_lines} line(s) longer than {analyzer.cap_bytes >> 10} KB were read by "
                       "their last part only")
    if outcome.analysis_error is not None:
        reasons.append(f"the live analysis stopped after an internal error ({outcome.analysis_error}); the "
                       "output after it was not checked")
    return reasons


def write_reports(result: WatchResult, report_dir: Path, command: list[str]) -> list[Path]:
    from lossguard.report.json_report import write_json

    report = result.to_dict()
    report["watch"]["command"] = list(command)
    json_path = report_dir / "report.json"
    with open(json_path, "w", encoding="utf-8") as handle:
        write_json(report, handle)
    paths = [json_path]
    # The HTML report is another engineer's module: write it when it is there.
    if importlib.util.find_spec("lossguard.report.html") is not None:
        from lossguard.report.html import write_html

        html_path = report_dir / "report.html"
        write_html(result.diagnosis, html_path)
        paths.append(html_path)
    return paths
