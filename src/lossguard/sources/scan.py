"""Finding the lines worth parsing in a big log, with flat memory.

grep over the parser's anchor strings does the scan when grep exists (many times faster than a
Python regex alternation); a chunked Python scan is the fallback and serves in-memory streams.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from lossguard.sources import patterns as P

try:
    import resource
except ImportError:  # not on Windows: grep runs without the cap there
    resource = None

CHUNK_BYTES = 8 << 20
_PIPE_BYTES = 64 << 10
# A line longer than this (a binary blob, a runaway print, a hostile line) is parsed by its head only, so
# memory and parse time are bounded by the cut, not by the line.
MAX_LINE = 64 << 10
# grep keeps a whole line in memory; a 1 GB line without a newline would take GBs. Its address space is
# capped, and if it runs out the Python scan takes over where grep stopped.
_GREP_MEMORY = 192 << 20


# Terminal colour / style codes (rich, loguru, colorlog consoles copied with them): `\x1b[32m2.31\x1b[0m`. They
# split names from numbers, so a line is read as it prints. Looked for once per block read, not per line: a
# log without them pays one memchr per megabyte.
ANSI = re.compile(rb"\x1b\[[0-9;]*[A-Za-z]")


def uncoloured(text: bytes) -> bytes:
    """`text` without colour codes. ESC alone is looked for first: one memchr, where the two-byte search costs
    as much as the rest of a grep block's handling."""
    return ANSI.sub(b"", text) if b"\x1b" in text and b"\x1b[" in text else text


@dataclass(slots=True)
class ScanCounts:
    """What the scan had to leave out, for the report."""

    cut_lines: int = 0
    first_cut_line: int | None = None

    def cut(self, line_no: int) -> None:
        self.cut_lines += 1
        if self.first_cut_line is None:
            self.first_cut_line = line_no


# An overlong line is parsed as its first and last HALF bytes: the head says what the line is, the tail holds
# what was printed last (the dict after a dumped tensor, the latest redraw of a progress bar).
HALF = MAX_LINE // 2
_JOINT = b" ... "  # no name or number spans it, so no pair is made across the cut
_ENDS = HALF + 16  # what a pending partial line keeps of each end (room for grep's `N:` prefix)


def _bounded(line_no: int, line: bytes, counts: ScanCounts | None) -> bytes:
    if len(line) <= MAX_LINE:
        return line
    if counts is not None:
        counts.cut(line_no)
    return line[:HALF] + _JOINT + line[-HALF:]


def _keep_ends(partial: bytes) -> bytes:
    """A line still being read, bounded: its head and its latest bytes; always longer than MAX_LINE once
    trimmed, so that `_bounded` cuts it (and counts it) when its end arrives."""
    return partial if len(partial) <= 2 * _ENDS else partial[:_ENDS] + partial[-_ENDS:]


def iter_lines(stream: BinaryIO, counts: ScanCounts | None = None, skip_to: int = 0) -> Iterator[tuple[int, bytes]]:
    """(line number, line) for anchor-bearing lines only, reading big chunks; memory stays flat. Lines up
    to `skip_to` are counted, not yielded (a resumed scan)."""
    line_no = 0
    tail = b""  # the line being read (its two ends only, once overlong)
    anchors = P.ANCHORS
    while chunk := stream.read(CHUNK_BYTES):
        buf = tail + chunk
        cut = buf.rfind(b"\n") + 1
        body, tail = buf[:cut], _keep_ends(buf[cut:])
        if not body:
            continue
        body = uncoloured(body)  # whole lines only: no code is cut
        pos = 0
        counted_to = 0
        while match := anchors.search(body, pos):
            start = body.rfind(b"\n", 0, match.start()) + 1
            end = body.find(b"\n", match.end())
            line_no += body.count(b"\n", counted_to, start) + 1
            counted_to = end + 1
            if line_no > skip_to:
                yield line_no, _bounded(line_no, body[start:end], counts)
            pos = end + 1
        line_no += body.count(b"\n", counted_to)
    tail = uncoloured(tail)
    if tail and anchors.search(tail) and line_no + 1 > skip_to:
        yield line_no + 1, _bounded(line_no + 1, tail, counts)


def bounded_lines(stream: BinaryIO, counts: ScanCounts | None = None) -> Iterator[tuple[int, bytes]]:
    """Every line of `stream`, each at most MAX_LINE bytes (a longer one: its two ends, see `_bounded`)."""
    line_no = 0
    while line := stream.readline(MAX_LINE + 1):
        line_no += 1
        if len(line) > MAX_LINE and not line.endswith(b"\n"):
            while not line.endswith(b"\n") and (rest := stream.readline(CHUNK_BYTES)):
                line = _keep_ends(line + rest)
            line = _bounded(line_no, line.rstrip(b"\n"), counts) + b"\n"
        yield line_no, line


def _ere(literal: str) -> str:
    """`literal` as a POSIX extended regex that matches only itself."""
    return re.sub(r"([.[\\(){*+?|^$])", r"\\\1", literal)  # `]` and `}` alone are plain characters


# The anchors as one POSIX extended regex of escaped literals, not `grep -F -e A -e B ...`: the same lines,
# and GNU grep 3.x scans for an alternation of literals a quarter faster than for a list of fixed strings
# (0.22 s against 0.30 s on bench/analyze_speed.py's log). The scan runs beside the parser; on two cores
# it is the other half of analyze's time.
GREP_OPTIONS = ("-E", "-a", "-n", "--no-messages", "-e", "|".join(_ere(a) for a in P.ANCHOR_STRINGS))


def iter_grep_lines(path: Path, counts: ScanCounts | None = None) -> Iterator[tuple[int, bytes]] | None:
    """Like `iter_lines`, with grep doing the scan: it finds the few anchor-bearing lines of a big log many
    times faster than Python's regex alternation. None when grep is not available."""
    if os.environ.get("LOSSGUARD_NO_GREP"):
        return None
    args = ["grep", *GREP_OPTIONS, "--", str(path)]
    try:  # Popen finds grep on PATH; none there is an OSError
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                env={**os.environ, "LC_ALL": "C"}, preexec_fn=_cap_memory)
    except OSError:
        return None
    return _read_grep(proc, path, counts)


def _cap_memory() -> None:  # runs in the grep child before exec
    if resource is None:
        return
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (_GREP_MEMORY, _GREP_MEMORY))


def _read_grep(proc: subprocess.Popen, path: Path, counts: ScanCounts | None) -> Iterator[tuple[int, bytes]]:
    """grep's `N:line` output, read in big blocks (a readline per line costs more than the parse)."""
    pending = b""  # a line whose end has not arrived yet (its two ends only, once overlong)
    last = 0
    try:
        # A pipe holds 64 KiB: asking for more allocates a bigger buffer on every read and gets no more.
        while block := proc.stdout.read1(_PIPE_BYTES):
            if pending:
                block = pending + block
            block = uncoloured(block)  # a code cut at the block's end is whole once the next block joins it
            lines = block.split(b"\n")
            pending = _keep_ends(lines.pop())
            for raw in lines:
                number, _, line = raw.partition(b":")
                if number.isdigit():
                    last = int(number)
                    yield last, line if len(line) <= MAX_LINE else _bounded(last, line, counts)
        finished = proc.wait() in (0, 1)  # 1: no line matched; anything else: grep failed (out of memory)
        if pending and finished:  # grep ends its output with a newline; a killed grep may not
            number, _, line = pending.partition(b":")
            if number.isdigit():
                yield int(number), _bounded(int(number), uncoloured(line), counts)
    finally:
        proc.stdout.close()
        proc.kill()
        proc.wait()
    if not finished:  # go on in Python after the last line grep gave
        with open(path, "rb") as stream:
            yield from iter_lines(stream, counts, skip_to=last)
