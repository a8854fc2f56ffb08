"""Finding the lines worth parsing in a big log, with flat memory.

`grep -F` over the parser's anchor strings does the scan when grep exists (many times faster than a
Python regex alternation); a chunked Python scan is the fallback and serves in-memory streams.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from lossguard.sources import patterns as P

CHUNK_BYTES = 8 << 20


def iter_lines(stream: BinaryIO) -> Iterator[tuple[int, bytes]]:
    """(line number, line) for anchor-bearing lines only, reading big chunks; memory stays flat."""
    line_no = 0
    tail = b""
    anchors = P.ANCHORS
    while True:
        chunk = stream.read(CHUNK_BYTES)
        if not chunk:
            break
        buf = tail + chunk
        cut = buf.rfind(b"\n") + 1
        if cut == 0:
            # No newline in the whole buffer (a huge line): keep a bounded tail, never the whole file.
            tail = buf[-(1 << 20):]
            continue
        body, tail = buf[:cut], buf[cut:]
        pos = 0
        counted_to = 0
        while True:
            match = anchors.search(body, pos)
            if match is None:
                break
            start = body.rfind(b"\n", 0, match.start()) + 1
            end = body.find(b"\n", match.end())
            line_no_here = line_no + body.count(b"\n", counted_to, start) + 1
            line_no, counted_to = line_no_here - 1, start
            yield line_no_here, body[start:end]
            pos = end + 1
        line_no += body.count(b"\n", counted_to)
    if tail:
        match = anchors.search(tail)
        if match:
            yield line_no + 1, tail


def iter_grep_lines(stream_or_path: BinaryIO | Path) -> Iterator[tuple[int, bytes]] | None:
    """Like `iter_lines`, with `grep -F` doing the scan: it finds the few anchor-bearing lines of a big
    log many times faster than Python's regex alternation. None when grep is not available."""
    grep = shutil.which("grep")
    if grep is None or os.environ.get("LOSSGUARD_NO_GREP"):
        return None
    args = [grep, "-F", "-a", "-n", "--no-messages"]
    for anchor in P.ANCHOR_STRINGS:
        args += ["-e", anchor]
    if isinstance(stream_or_path, Path):
        args += ["--", str(stream_or_path)]
        stdin = subprocess.DEVNULL
    else:
        stdin = stream_or_path
    try:
        proc = subprocess.Popen(args, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                env={**os.environ, "LC_ALL": "C"})
    except OSError:
        return None
    return _read_grep(proc)


_MAX_LINE = 1 << 20  # a line longer than this (a binary blob, a runaway print) is parsed by its head only


def _read_grep(proc: subprocess.Popen) -> Iterator[tuple[int, bytes]]:
    """grep's `N:line` output, read in big blocks (a readline per line costs more than the parse)."""
    pending = b""  # the start of a line whose end has not arrived yet, at most _MAX_LINE bytes
    try:
        while block := proc.stdout.read1(1 << 20):
            lines = block.split(b"\n")
            if pending:
                lines[0] = pending + lines[0]
            pending = lines.pop()[:_MAX_LINE]
            for raw in lines:
                number, _, line = raw.partition(b":")
                if number.isdigit():
                    yield int(number), line if len(line) <= _MAX_LINE else line[:_MAX_LINE]
        if pending:  # grep ends its output with a newline; a killed grep may not
            number, _, line = pending.partition(b":")
            if number.isdigit():
                yield int(number), line
    finally:
        proc.stdout.close()
        proc.kill()
        proc.wait()


def is_real_file(stream: BinaryIO) -> bool:
    try:
        stream.fileno()
    except (AttributeError, OSError, ValueError):
        return False  # an in-memory stream: scan it in Python
    return True
