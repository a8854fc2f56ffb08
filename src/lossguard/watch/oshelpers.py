"""Small OS helpers for `watch`: exit codes, non-blocking writes, pidfds, self-pipes."""

from __future__ import annotations

import os
import select
import socket

_PIPE_BYTES = 1 << 20  # ask Linux for 1 MiB pipes: fewer wake-ups, the child rarely blocks on us


def exit_code_for(returncode: int) -> int:
    """A shell's convention: 128+N for a command killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def write_all(fd: int, data: bytes) -> bool:
    """Write everything (our stdout may be a slow or non-blocking pipe). False once the reader is gone."""
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except BlockingIOError:
            wait_writable(fd)
            continue
        except (BrokenPipeError, OSError):
            return False
        view = view[written:]
    return True


def wait_writable(fd: int) -> None:
    select.select([], [fd], [], 1.0)


def try_grow_pipe(fd: int) -> None:
    try:
        import fcntl

        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
    except (ImportError, AttributeError, OSError):
        pass  # not Linux, or over /proc/sys/fs/pipe-max-size: the default 64 KiB works, just more wake-ups


def pidfd_open(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def drain_socket(sock: socket.socket) -> None:
    try:
        while sock.recv(4096):
            pass
    except (BlockingIOError, InterruptedError):
        pass


def in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
