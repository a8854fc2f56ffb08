"""The source protocol: every log format is a module with `sniff` and `parse`.

`sniff(path, head)` says from the file name and its first bytes whether this source reads the file;
`parse(path)` yields records in file order. Sources translate their own key names to the signal
catalog (`core.signals.canonical`) and never decide what is wrong: detectors do.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from lossguard.core.records import Record


class Source(Protocol):
    name: str

    def sniff(self, path: Path, head: bytes) -> bool: ...

    def parse(self, path: Path) -> Iterator[Record]: ...


class SourceError(ValueError):
    """Raised with a message that names the file, the line or key, and what to do next."""


def _int_or_float(text: str) -> int | float:
    """Python refuses ints of more than 4300 digits (a ValueError from inside json); as a float such a
    number is infinite, which the detectors understand."""
    return int(text) if len(text) <= 4000 else float(text)


# JSON of logs is read with this decoder: a 5000-digit number is a value (inf), not an exception.
JSON = json.JSONDecoder(parse_int=_int_or_float)
JSON_ERRORS = (ValueError, RecursionError)  # RecursionError: `[[[[...` nested deeper than the stack
