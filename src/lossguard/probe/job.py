"""The one way lossguard runs a training job (probe arms, zoo scenarios, the demo) and leaves nothing behind.

A `Job` is a command started in its own session, so the launcher and every rank it forks share one process
group; its combined stdout+stderr goes byte for byte to a log file. However the job ends (it exits, it
overstays its deadline, the caller raises, lossguard itself is told to stop), the whole group is sent
SIGTERM, then SIGKILL after a grace period, until no live process of it remains. Killing only the launcher
is not enough: torchrun's ranks are its children and would train on, orphaned.

The caller's own termination is covered too: every running job is registered, `atexit` stops them all,
and `stop_jobs_on_signals()` (used by the CLI commands and the bench scripts) turns SIGTERM / SIGHUP /
SIGINT into "stop every job, then exit".
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

TERM_GRACE_S = 10.0  # torchrun forwards SIGTERM to its ranks and waits for them: give it that time
KILL_GRACE_S = 5.0
_GONE_POLL_S = 0.05

_running: set[Job] = set()
_running_lock = threading.RLock()  # re-entrant: the signal handler may run while this thread holds it


class Job:
    """A command running in its own process group, its output in `log_path`."""

    def __init__(self, argv: list[str], log_path: Path, env: dict[str, str] | None = None, *,
                 term_grace_s: float = TERM_GRACE_S) -> None:
        self.argv = argv
        self.term_grace_s = term_grace_s
        self.log_path = Path(log_path)
        self.start_s = time.monotonic()
        self.timed_out = False
        with open(self.log_path, "wb") as log:
            # start_new_session: the launcher and every rank it forks share one process group we can kill.
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        self.pgid = self.proc.pid
        with _running_lock:
            _running.add(self)

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.start_s

    def wait(self, timeout_s: float, *, on_tick: Callable[[float], None] | None = None,
             tick_s: float = 0.5) -> int:
        """Wait for the launcher to exit (or `timeout_s`, then stop the group); `on_tick(elapsed_s)` runs
        every `tick_s` meanwhile. Whatever the launcher left running in its group is stopped too."""
        while True:
            try:
                self.proc.wait(timeout=tick_s)
                break
            except subprocess.TimeoutExpired:
                pass
            if on_tick is not None:
                on_tick(self.elapsed_s)
            if self.elapsed_s > timeout_s:
                self.timed_out = True
                break
        self.stop()
        return self.proc.wait()

    def stop(self) -> None:
        """SIGTERM the whole group, SIGKILL what outlives the grace period; returns once none of it lives
        (or, for a process stuck in the kernel, after both grace periods)."""
        try:
            for sig, grace_s in ((signal.SIGTERM, self.term_grace_s), (signal.SIGKILL, KILL_GRACE_S)):
                if not self._group_alive():
                    return
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.pgid, sig)
                if self._wait_group_gone(grace_s):
                    return
        finally:
            self.proc.poll()  # reap the launcher if it is done
            with _running_lock:
                _running.discard(self)

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _group_alive(self) -> bool:
        self.proc.poll()  # a launcher that exited but was not reaped is a zombie: not alive
        return bool(group_members(self.pgid))

    def _wait_group_gone(self, grace_s: float) -> bool:
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if not self._group_alive():
                return True
            time.sleep(_GONE_POLL_S)
        return not self._group_alive()


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group `pgid`."""
    proc_dir = Path("/proc")
    if not proc_dir.is_dir():  # no procfs (macOS): signal 0 says whether any member exists
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        return [pgid]
    members = []
    for entry in proc_dir.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # exited while we looked
            continue
        state, _ppid, pgrp = stat[stat.rindex(")") + 2:].split()[:3]  # after "(comm)", which may hold spaces
        if state != "Z" and int(pgrp) == pgid:
            members.append(int(entry.name))
    return members


def stop_all_jobs() -> None:
    """Stop every job this process started that is still running."""
    with _running_lock:
        jobs = list(_running)
    for job in jobs:
        job.stop()


atexit.register(stop_all_jobs)


@contextlib.contextmanager
def stop_jobs_on_signals() -> Iterator[None]:
    """While inside: SIGTERM, SIGHUP or SIGINT stops every running job, then exits (128 + the signal's
    number; SIGINT raises KeyboardInterrupt as usual). Without this, a killed caller would orphan its jobs,
    which run in their own sessions and never see the terminal's or the caller's signals."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers belong to the main thread; atexit and the jobs' own cleanup still apply
        return
    signals = [signal.SIGTERM, signal.SIGINT] + ([signal.SIGHUP] if hasattr(signal, "SIGHUP") else [])
    previous = {sig: signal.getsignal(sig) for sig in signals}

    def handler(signum: int, _frame: object) -> None:
        stop_all_jobs()
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)

    for sig in signals:
        signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
