"""Run a command in its own process group, pass its output through byte for byte, stop it on request.

One thread, one `selectors` loop over: the child's stdout and stderr pipes (raw, non-blocking), a
pidfd for the child's exit (Linux; polled elsewhere), and a self-pipe that our signal handlers wake.
Every chunk is written through first (`os.write`, unbuffered, so colours and tqdm's `\\r` redraws arrive
as the child wrote them), then logged and analysed line by line. Stopping is SIGINT to the group,
SIGTERM after the grace period, SIGKILL last; processes the command leaves behind in its group get the
same treatment, so nothing outlives `watch` in that group. A command `watch` stopped leaves no torch
extension build lock of its own behind, as a probe or demo job stopped by lossguard does
(`preflight.release_build_locks`): stopped inside torch's JIT-load window, a DeepSpeed op's `lock` would
make every later job that loads the op wait on it forever.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import subprocess
import sys
import time

from lossguard.probe.preflight import release_build_locks
from lossguard.procs import JOB_ENV, job_members, new_token
from lossguard.watch.analyzer import Alert, LiveAnalyzer
from lossguard.watch.banner import render_banner
from lossguard.watch.lines import LineAssembler
from lossguard.watch.oshelpers import (
    drain_socket,
    exit_code_for,
    in_main_thread,
    pidfd_open,
    try_grow_pipe,
    write_all,
)
from lossguard.watch.outcome import EXIT_HALTED, SignalSent, WatchConfig, WatchOutcome

READ_BYTES = 1 << 20
_BANNER_WAIT_S = 0.5  # a warning banner waits this long for both streams to reach a line end
_DRAIN_S = 0.2  # the group is gone but a pipe is still open (held outside the group): read this long
_GIVE_UP_S = 5.0  # after SIGKILL, stop waiting for a process the kernel cannot kill (D state)
_GROUP_POLL_S = 0.1
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)


class _Stream:
    def __init__(self, pipe, out_fd: int) -> None:
        self.pipe = pipe
        self.fd = pipe.fileno()
        self.out_fd = out_fd
        self.lines = LineAssembler()
        self.at_line_start = True  # what we passed through last ended with a newline
        self.out_broken = False  # our own stdout/stderr was closed (e.g. `| head`): keep draining


class Watcher:
    def __init__(self, config: WatchConfig, analyzer: LiveAnalyzer | None = None) -> None:
        self.config = config
        self.analyzer = analyzer or LiveAnalyzer(halt_on=config.halt_on)
        self.outcome = WatchOutcome(exit_code=0, returncode=None)
        self._color = os.isatty(config.stderr_fd) if config.color is None else config.color
        self._banners: list[bytes] = []
        self._banner_since: float | None = None
        self._stage = 0  # 0 running, 1 SIGINT sent, 2 SIGTERM sent, 3 SIGKILL sent
        self._stop_deadline: float | None = None
        self._drain_deadline: float | None = None
        self._next_group_poll = 0.0
        self._last_alive = True
        self._mid_line = False  # the last bytes passed through (either stream) did not end a line
        self._received: list[int] = []
        self._gave_up = False
        self._log = None

    # -- entry point -------------------------------------------------------------------------------
    def run(self) -> WatchOutcome:
        """Raises FileNotFoundError / PermissionError when the command cannot be started."""
        self._t0 = time.monotonic()
        self._start_wall = time.time()  # the build locks a stop may release are the ones made since
        # Signal handlers go in before the spawn: a Ctrl-C in between is queued and forwarded, never lost
        # with the job left running. The log is opened first: a bad path must not leave a job running.
        self._wake_r, self._wake_w = socket.socketpair()
        for sock in (self._wake_r, self._wake_w):
            sock.setblocking(False)
        restore = self._install_signal_handlers()
        try:
            if self.config.log_path is not None:
                self._log = open(self.config.log_path, "wb", buffering=0)  # noqa: SIM115 - closed below
            self._proc = self._spawn()
        except BaseException:
            restore()
            self._wake_r.close()
            self._wake_w.close()
            if self._log is not None:
                self._log.close()
            raise
        self._streams = {s.fd: s for s in (_Stream(self._proc.stdout, self.config.stdout_fd),
                                           _Stream(self._proc.stderr, self.config.stderr_fd))}
        self._assemblers = [s.lines for s in self._streams.values()]  # kept after a stream closes
        try:
            self._loop()
        finally:
            restore()
            self._wake_r.close()
            self._wake_w.close()
            for stream in list(self._streams.values()):
                self._close(stream)
            self._flush_banners(force=True)
            if self._log is not None:
                self._log.close()
        return self._finish()

    def _spawn(self) -> subprocess.Popen:
        env = dict(os.environ if self.config.env is None else self.config.env)
        # The token marks every process of the command, torchrun's ranks too (sessions of their own).
        self._token = env[JOB_ENV] = new_token()
        self._env = env
        if self.config.unbuffered:
            env.setdefault("PYTHONUNBUFFERED", "1")
            # rich (Lightning's default progress bar) draws nothing into a pipe until the bar ends, maybe
            # hours later: told the pipe is terminal-like, it redraws in place as on a terminal (a carriage
            # return before each redraw, as tqdm does), and the redraws are read as they stream. A value the
            # user set (TTY_COMPATIBLE=0) stands.
            env.setdefault("TTY_COMPATIBLE", "1")
        group = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
        proc = subprocess.Popen(self.config.command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                bufsize=0, **group)
        self._pgid = self.outcome.pid = proc.pid
        for pipe in (proc.stdout, proc.stderr):
            os.set_blocking(pipe.fileno(), False)
            try_grow_pipe(pipe.fileno())
        return proc

    # -- the loop ------------------------------------------------------------------------------------
    def _loop(self) -> None:
        self._sel = selectors.DefaultSelector()
        for stream in self._streams.values():
            self._sel.register(stream.fd, selectors.EVENT_READ, stream)
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._pidfd = pidfd_open(self._proc.pid)
        if self._pidfd is not None:
            self._sel.register(self._pidfd, selectors.EVENT_READ, "exit")
        try:
            while not self._done():
                for key, _ in self._sel.select(self._timeout()):
                    if isinstance(key.data, _Stream):
                        self._on_readable(key.data)
                    elif key.data == "wake":
                        drain_socket(self._wake_r)
                    elif key.data == "exit":
                        self._sel.unregister(self._pidfd)
                        os.close(self._pidfd)
                        self._pidfd = None
                self._reap()
                self._on_signals()
                self._tick()
        finally:
            if self._pidfd is not None:
                os.close(self._pidfd)
            self._sel.close()

    def _done(self) -> bool:
        if self._gave_up:
            return True
        return self.outcome.returncode is not None and not self._streams and not self._group_alive()

    def _timeout(self) -> float | None:
        now = time.monotonic()
        deadlines = [d for d in (self._stop_deadline, self._drain_deadline) if d is not None]
        if self._banners and self._banner_since is not None:
            deadlines.append(self._banner_since + _BANNER_WAIT_S)
        if self.outcome.returncode is not None:
            deadlines.append(self._next_group_poll)
        elif self._pidfd is None:
            deadlines.append(now + 0.05)  # no pidfd on this platform: poll for the exit
        if not deadlines:
            return None
        return max(0.0, min(deadlines) - now)

    # -- output ----------------------------------------------------------------------------------------
    def _on_readable(self, stream: _Stream) -> None:
        try:
            data = os.read(stream.fd, READ_BYTES)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._close(stream)
            return
        self.outcome.num_bytes += len(data)
        self._pass_through(stream, data)
        log, parse, redraws = stream.lines.push(data)
        if log and self._log is not None:
            self._log.write(log)
        if parse:
            self._analyze(parse, complete=True)
        if redraws:
            self._analyze(redraws, complete=False, in_progress=True)
        self._flush_banners(force=False)

    def _pass_through(self, stream: _Stream, data: bytes) -> None:
        if not stream.out_broken:
            stream.out_broken = not write_all(stream.out_fd, data)
        stream.at_line_start = data.endswith(b"\n")
        self._mid_line = not stream.at_line_start

    def _close(self, stream: _Stream) -> None:
        if stream.fd not in self._streams:
            return
        del self._streams[stream.fd]
        with contextlib.suppress(KeyError, ValueError, AttributeError):
            self._sel.unregister(stream.fd)
        log, parse = stream.lines.flush()
        if log and self._log is not None:
            self._log.write(log)
        if parse:
            self._analyze(parse, complete=False)
        stream.pipe.close()

    def _analyze(self, body: bytes, *, complete: bool, in_progress: bool = False) -> None:
        if self.analyzer is None:
            return
        try:
            alerts = self.analyzer.feed(body, complete=complete, in_progress=in_progress)
        except Exception as exc:  # a lossguard bug must never take the user's job down with it
            self.outcome.analysis_error = f"{type(exc).__name__}: {exc}"
            self.analyzer = None
            self._queue(f"lossguard: internal error in the live analysis ({self.outcome.analysis_error}); "
                        "the job runs on unwatched. Please report this.\n".encode())
            return
        for alert in alerts:
            self._on_alert(alert)

    # -- findings and halting ----------------------------------------------------------------------
    def _on_alert(self, alert: Alert) -> None:
        halting = alert.halt and not self.outcome.halted and self.outcome.returncode is None
        note = (f"stopping the job (--halt-on {self.config.halt_on}): SIGINT now, SIGTERM after "
                f"{self.config.grace_s:g}s, then SIGKILL") if halting else None
        self._queue(render_banner(alert, color=self._color, halting=note))
        if halting:
            self.outcome.halted = True
            self.outcome.halt_line, self.outcome.halt_step = alert.line_no, alert.step
            self._flush_banners(force=True)  # the banner comes before the job's shutdown noise
            self._escalate(1, "halt: " + (alert.diagnosis.signature or alert.diagnosis.verdict))

    def _queue(self, banner: bytes) -> None:
        self._banners.append(banner)
        if self._banner_since is None:
            self._banner_since = time.monotonic()

    def _flush_banners(self, *, force: bool) -> None:
        if not self._banners:
            return
        at_start = all(s.at_line_start for s in self._streams.values() if not s.out_broken)
        waited = self._banner_since is not None and time.monotonic() - self._banner_since >= _BANNER_WAIT_S
        if not (at_start or force or waited):
            return
        # A partial line (a tqdm bar) is ended first rather than written into.
        data = (b"" if at_start else b"\n") + b"".join(self._banners)
        self._banners, self._banner_since = [], None
        write_all(self.config.stderr_fd, data)
        self._mid_line = False
        err = next((s for s in self._streams.values() if s.out_fd == self.config.stderr_fd), None)
        if err is not None:
            err.at_line_start = True

    # -- signals and stopping -------------------------------------------------------------------------
    def _install_signal_handlers(self):
        if sys.platform == "win32" or not in_main_thread():
            return lambda: None
        previous = {}
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            current = signal.getsignal(signum)
            if current == signal.SIG_IGN:
                continue  # started with it ignored (nohup, `&` without job control): keep it so
            previous[signum] = signal.signal(signum, lambda n, _f: self._received.append(n))
        # The handlers only note the signal; the wake-up fd makes select() return so the loop acts on it.
        old_wakeup = signal.set_wakeup_fd(self._wake_w.fileno(), warn_on_full_buffer=False)

        def restore() -> None:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            signal.set_wakeup_fd(old_wakeup)

        return restore

    def _on_signals(self) -> None:
        while self._received:
            signum = self._received.pop(0)
            if self.outcome.returncode is not None and not self._group_alive():
                continue
            if signum == signal.SIGINT:
                self._escalate(self._stage + 1, "Ctrl-C forwarded" if self._stage == 0 else "Ctrl-C again")
            else:
                name = signal.Signals(signum).name
                self._send(signum, f"{name} received by lossguard, forwarded")
                self._stage = max(self._stage, 2)
                self._stop_deadline = time.monotonic() + self.config.grace_s

    def _escalate(self, stage: int, why: str) -> None:
        stage = min(max(stage, self._stage + 1), len(_STOP_SIGNALS))
        if stage <= self._stage:
            return
        self._stage = stage
        self._send(_STOP_SIGNALS[stage - 1], why)
        wait = self.config.grace_s if stage < len(_STOP_SIGNALS) else _GIVE_UP_S
        self._stop_deadline = time.monotonic() + wait

    def _send(self, signum: int, why: str) -> None:
        sent = False
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._pgid, signum)
            sent = True
        if signum != signal.SIGINT:  # Ctrl-C goes to the launcher alone, which hands it on as it does
            for pid in self._members():  # ranks outside the group (torchrun's sessions)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signum)
                    sent = True
        if not sent:
            return
        self.outcome.signals.append(SignalSent(round(time.monotonic() - self._t0, 3),
                                               signal.Signals(signum).name, why))

    def _reap(self) -> None:
        if self.outcome.returncode is None and self._proc.poll() is not None:
            self.outcome.returncode = self._proc.returncode
            self._next_group_poll = time.monotonic()
            if self._stage == 0:
                # What the command leaves running in its group gets the grace period, then SIGTERM.
                self._stop_deadline = time.monotonic() + self.config.grace_s

    def _members(self) -> list[int]:
        return job_members(self._pgid, self._token)

    def _group_alive(self) -> bool:
        if self.outcome.returncode is None:
            return True
        now = time.monotonic()
        if now < self._next_group_poll:
            return self._last_alive
        self._next_group_poll = now + _GROUP_POLL_S
        self._last_alive = bool(self._members())
        return self._last_alive

    def _tick(self) -> None:
        now = time.monotonic()
        self._flush_banners(force=False)
        exited = self.outcome.returncode is not None
        if exited and self._streams and not self._group_alive():
            # Nobody in the group holds the pipes any more, yet they are open (passed outside the group):
            # read what is there, then stop listening.
            if self._drain_deadline is None:
                self._drain_deadline = now + _DRAIN_S
            elif now >= self._drain_deadline:
                for stream in list(self._streams.values()):
                    self._close(stream)
        if self._stop_deadline is not None and now >= self._stop_deadline:
            self._stop_deadline = None
            if not exited or self._group_alive():
                if self._stage >= len(_STOP_SIGNALS):
                    self._gave_up = True
                    self.outcome.leftovers = self._members()
                elif self._stage == 0:  # the command exited and left processes in its group
                    self._escalate(2, "left running in the command's process group after it exited")
                else:
                    self._escalate(self._stage + 1, "grace period over")

    # -- result ------------------------------------------------------------------------------------------
    def _finish(self) -> WatchOutcome:
        outcome = self.outcome
        if outcome.returncode is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                outcome.returncode = self._proc.wait(timeout=1.0)
        outcome.wall_s = time.monotonic() - self._t0
        if outcome.signals and not outcome.leftovers and not self._members():  # stopped by us, all gone
            with contextlib.suppress(Exception):
                release_build_locks(self._env, self._start_wall)
        outcome.ended_mid_line = self._mid_line
        if self.analyzer is not None:
            outcome.num_lines = self.analyzer.num_lines
            outcome.cut_lines = self.analyzer.cut_lines
        outcome.cut_lines += sum(lines.cut_lines for lines in getattr(self, "_assemblers", []))
        if outcome.halted:
            outcome.exit_code = EXIT_HALTED
        elif outcome.returncode is None:
            outcome.exit_code = 128 + signal.SIGKILL
        else:
            outcome.exit_code = exit_code_for(outcome.returncode)
        return outcome
