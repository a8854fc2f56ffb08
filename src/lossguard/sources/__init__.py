"""Log sources and input discovery: PATH... (files, directories, `-`) -> one record stream.

When several sources describe the same run (a directory with trainer_state.json, TensorBoard events
and the stdout log), the numbers come from the most precise one and the others contribute only their
events and facts (OVERFLOW lines, warnings, the DeepSpeed config dump), so no step is counted twice.
The list of sources, most precise first, is `SOURCES` in `sources/registry.py`.
"""

from __future__ import annotations

from collections.abc import Iterator

from lossguard.core.records import Record
from lossguard.sources.gather import Gathering, discover_inputs, merged_records
from lossguard.sources.registry import CHECKPOINT, SKIP_NAMES, SKIP_SUFFIXES, SOURCES, Input, sniff

__all__ = ["CHECKPOINT", "SKIP_NAMES", "SKIP_SUFFIXES", "SOURCES", "Gathering", "Input", "discover", "records",
           "sniff"]


def discover(paths: list[str], gathering: Gathering | None = None) -> list[Input]:
    """The inputs of PATH... (files, directories, `-`, pipes): each read once (see `sources/gather.py`)."""
    return discover_inputs(paths, gathering)


def records(inputs: list[Input], gathering: Gathering | None = None) -> Iterator[Record]:
    """All inputs as one stream, the numbers of several sources merged on the run's steps."""
    return merged_records(inputs, gathering)
