"""Keep what dependencies print off lint's stdout.

DeepSpeed's import logs "Setting accelerator to CPU" through a handler bound to the process's stdout, and
its config classes log while validating: with `--format json|sarif|github` stdout must be only the report.
The redirect is at the file-descriptor level because a logging handler created at import time keeps its
own reference to the stream, which `contextlib.redirect_stdout` does not reach.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

__all__ = ["stdout_to_stderr"]


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send everything written to stdout (Python-level and fd 1) to stderr while the block runs."""
    _flush(sys.stdout)
    try:
        saved_fd = os.dup(1)
    except OSError:  # no fd 1 (embedded interpreter): fall back to the Python-level redirect
        with contextlib.redirect_stdout(sys.stderr):
            yield
        return
    try:
        os.dup2(2, 1)
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        _flush(sys.stdout)
        _flush(sys.__stdout__)
        os.dup2(saved_fd, 1)
        os.close(saved_fd)


def _flush(stream: object) -> None:
    with contextlib.suppress(Exception):
        stream.flush()  # type: ignore[attr-defined]
