"""Raw output bytes in, whole lines out, with flat memory.

One `LineAssembler` per child stream (stdout and stderr are split separately: a partial stdout line
must never be glued to a stderr line). It returns two views of each chunk:

- `log`: bytes ready for the log file, whole lines only, so the log reads like a terminal scrollback
  with stdout and stderr lines interleaved but never cut into each other;
- `parse`: the same whole lines for the parser, where an overlong line (tqdm redrawing one bar for an
  hour without a newline, a binary dump) is cut to its last `cap_bytes`: the HF dict the Trainer prints
  after tqdm's `\\r` text is at the end of the line, which is what the parser looks at.

An overlong partial line is written to the log in pieces once it passes `cap_bytes`, so nothing is held
beyond the cap and every byte still reaches the log.

A third view, `redraws`, reads a progress bar as it streams: tqdm and rich (on a terminal) redraw one line
with a carriage return before each redraw, and end it with a newline only when the bar closes, maybe 40
steps later. The complete redraws of the line in progress (everything up to its last `\r`) go to the
parser at once, and when the line ends, the parser gets only the part it has not read.
"""

from __future__ import annotations

MAX_LINE_BYTES = 1 << 20


class LineAssembler:
    def __init__(self, cap_bytes: int = MAX_LINE_BYTES) -> None:
        self.cap_bytes = cap_bytes
        self._pending = bytearray()  # the current partial line, not yet logged
        self._spilled = b""  # the last cap_bytes of an overlong line already logged (parser view only)
        self.cut_lines = 0  # overlong lines the parser saw the tail of (the report says so)
        self._read = 0  # bytes of the pending line the parser has had as redraws

    def push(self, chunk: bytes) -> tuple[bytes, bytes, bytes]:
        """(bytes to log, whole lines to parse, redraws of the line in progress to parse) for one chunk;
        any may be empty. The redraws have no newline: they are part of the line in progress."""
        cut = chunk.rfind(b"\n") + 1
        if cut == 0:
            self._pending += chunk
            redraws = self._redraws()
            return self._spill_if_long(), b"", redraws
        head = chunk[:cut]
        if self._pending:
            log = bytes(self._pending) + head
            self._pending = bytearray()
        else:
            log = head
        read, self._read = self._read, 0
        parse = log[read:]  # the redraws of its first line the parser already has
        if self._spilled:
            # The first line of `log` is the end of an overlong line: give the parser its tail only.
            first_end = log.find(b"\n") + 1
            parse = (self._spilled + log[:first_end])[-self.cap_bytes:] + log[first_end:]
            self._spilled = b""
        self._pending += chunk[cut:]
        redraws = self._redraws()
        spill = self._spill_if_long()
        return (log + spill if spill else log), parse, redraws

    def flush(self) -> tuple[bytes, bytes]:
        """At end of stream: the unterminated last line, if any (log bytes, parser view)."""
        log = bytes(self._pending)
        unread = log[self._read:]
        parse = (self._spilled + unread)[-self.cap_bytes:] if (self._spilled or unread) else b""
        self._pending = bytearray()
        self._spilled = b""
        self._read = 0
        return log, parse

    def _redraws(self) -> bytes:
        """The complete redraws of the pending line the parser has not had (up to its last `\r`)."""
        last = self._pending.rfind(b"\r")
        if last < self._read:
            return b""
        redraws = bytes(self._pending[self._read:last])
        self._read = last + 1
        return redraws if redraws.strip() else b""

    @property
    def mid_line(self) -> bool:
        return bool(self._pending or self._spilled)

    def _spill_if_long(self) -> bytes:
        if len(self._pending) <= self.cap_bytes:
            return b""
        spill = bytes(self._pending)
        if not self._spilled:  # the first spill of this line
            self.cut_lines += 1
        self._spilled = (self._spilled + spill)[-self.cap_bytes:]
        self._pending = bytearray()
        self._read = 0  # an overlong line's tail is parsed whole at its end
        return spill
