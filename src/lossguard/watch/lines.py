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
"""

from __future__ import annotations

MAX_LINE_BYTES = 1 << 20


class LineAssembler:
    def __init__(self, cap_bytes: int = MAX_LINE_BYTES) -> None:
        self.cap_bytes = cap_bytes
        self._pending = bytearray()  # the current partial line, not yet logged
        self._spilled = b""  # the last cap_bytes of an overlong line already logged (parser view only)
        self.cut_lines = 0  # overlong lines the parser saw the tail of (the report says so)

    def push(self, chunk: bytes) -> tuple[bytes, bytes]:
        """(bytes to log, whole lines to parse) for one chunk; both may be empty."""
        cut = chunk.rfind(b"\n") + 1
        if cut == 0:
            self._pending += chunk
            return self._spill_if_long(), b""
        head = chunk[:cut]
        if self._pending:
            log = bytes(self._pending) + head
            self._pending = bytearray()
        else:
            log = head
        parse = log
        if self._spilled:
            # The first line of `log` is the end of an overlong line: give the parser its tail only.
            first_end = log.find(b"\n") + 1
            parse = (self._spilled + log[:first_end])[-self.cap_bytes:] + log[first_end:]
            self._spilled = b""
        self._pending += chunk[cut:]
        spill = self._spill_if_long()
        return (log + spill if spill else log), parse

    def flush(self) -> tuple[bytes, bytes]:
        """At end of stream: the unterminated last line, if any (log bytes, parser view)."""
        log = bytes(self._pending)
        parse = (self._spilled + log)[-self.cap_bytes:] if (self._spilled or log) else b""
        self._pending = bytearray()
        self._spilled = b""
        return log, parse

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
        return spill
