"""The one way lossguard runs a training job (probe arms, zoo scenarios, the demo) and leaves nothing behind.

A `Job` is a command started in its own session, its combined stdout+stderr going byte for byte to a log
file. However the job ends (it exits, it overstays its deadline, the caller raises, lossguard itself is told
to stop), every process of the job is sent SIGTERM, then SIGKILL after a grace period, until none lives.

"Every process of the job" is its process group plus every process carrying the job's token in its
environment (lossguard/procs.py): torchrun starts each rank in a session of its own, so a launcher killed
on its own, or a group signalled without the launcher's help, would leave ranks training on, orphaned.

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

from lossguard.probe.preflight import release_build_locks
from lossguard.procs import JOB_ENV, job_members, new_token

TERM_GRACE_S = 10.0  # torchrun forwards SIGTERM to its ranks and waits for them: give it that time
KILL_GRACE_S = 5.0
_GONE_POLL_S = 0.1

_running: set[Job] = set()
_running_lock = threading.RLock()  # re-entrant: the signal handler may run while this thread holds it


class Job:
    """A command running in its own session, its output in `log_path`."""

    def __init__(self, argv: list[str], log_path: Path, env: dict[str, str] | None = None, *,
                 term_grace_s: float = TERM_GRACE_S) -> None:
        self.argv = argv
        self.term_grace_s = term_grace_s
        self.log_path = Path(log_path)
        self.start_s = time.monotonic()
        self.start_wall = time.time()  # the build locks a stop may release are the ones made since
        self.timed_out = False
        self.token = new_token()
        env = self.env = {**(os.environ if env is None else env), JOB_ENV: self.token}
        with open(self.log_path, "wb") as log:
            # start_new_session: the job gets a process group of its own, away from the caller's terminal.
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
        """Wait for the launcher to exit (or `timeout_s`, then stop the job); `on_tick(elapsed_s)` runs
        every `tick_s` meanwhile. Whatever of the job the launcher left running is stopped too."""
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
        """SIGTERM every process of the job, SIGKILL what outlives the grace period; returns once none of
        it lives (or, for a process stuck in the kernel, after both grace periods). A job stopped here
        leaves no torch extension build lock of its own behind (`preflight.release_build_locks`)."""
        stopped = False
        try:
            for sig, grace_s in ((signal.SIGTERM, self.term_grace_s), (signal.SIGKILL, KILL_GRACE_S)):
                pids = self.members()
                if not pids:
                    return
                stopped = True
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.pgid, sig)
                for pid in pids:  # the ranks in sessions of their own
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, sig)
                if self._wait_gone(grace_s):
                    return
        finally:
            self.proc.poll()  # reap the launcher if it is done
            with _running_lock:
                _running.discard(self)
            if stopped and not self.members():
                with contextlib.suppress(Exception):
                    release_build_locks(self.env, self.start_wall)

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def members(self) -> list[int]:
        """The live (not zombie) processes of this job."""
        self.proc.poll()  # a launcher that exited but was not reaped is a zombie: not alive
        return job_members(self.pgid, self.token)

    def _wait_gone(self, grace_s: float) -> bool:
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if not self.members():
                return True
            time.sleep(_GONE_POLL_S)
        return not self.members()


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
