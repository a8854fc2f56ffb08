"""What `lossguard watch` is told (`WatchConfig`) and what it reports (`WatchOutcome`, its exit codes).

Plain records, kept apart from the process loop that fills them (`watch/process.py`): the loop, its
pipes, signals and stopping ladder, is what needs careful reading, and these are read by the CLI too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

# Exit codes of `lossguard watch` besides the child's own (documented in --help and docs/watch.md).
EXIT_HALTED = 3  # lossguard stopped the command (--halt-on)
EXIT_NOT_EXECUTABLE = 126  # as a shell: the command exists but cannot be run
EXIT_NOT_FOUND = 127  # as a shell: no such command


@dataclass
class WatchConfig:
    command: list[str]
    halt_on: str | None = None
    grace_s: float = 10.0
    log_path: Path | None = None
    unbuffered: bool = True  # PYTHONUNBUFFERED=1 for the child unless it is set already
    env: dict[str, str] | None = None
    color: bool | None = None  # banner colours; default: when our stderr is a terminal
    stdout_fd: int = 1
    stderr_fd: int = 2


@dataclass
class SignalSent:
    after_s: float
    signal: str
    why: str


@dataclass
class WatchOutcome:
    exit_code: int
    returncode: int | None  # Popen style: negative = killed by that signal
    pid: int | None = None  # the command's pid, also its process group id
    halted: bool = False
    halt_line: int | None = None
    halt_step: int | None = None
    signals: list[SignalSent] = field(default_factory=list)
    leftovers: list[int] = field(default_factory=list)  # group members still alive when we gave up
    wall_s: float = 0.0
    num_lines: int = 0
    num_bytes: int = 0
    analysis_error: str | None = None
    cut_lines: int = 0  # lines longer than the cap, parsed by their last part
    ended_mid_line: bool = False  # the command's last output line had no newline: start ours on a new one

    def to_dict(self) -> dict:
        return {"exit_code": self.exit_code, "returncode": self.returncode, "pid": self.pid,
                "halted": self.halted,
                "halt_line": self.halt_line, "halt_step": self.halt_step,
                "signals": [vars(s) for s in self.signals], "leftover_pids": self.leftovers,
                "wall_s": round(self.wall_s, 3), "num_lines": self.num_lines, "num_bytes": self.num_bytes,
                "analysis_error": self.analysis_error}
