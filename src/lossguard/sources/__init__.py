"""Log sources and input discovery: PATH... (files, directories, `-`) -> one record stream.

When several sources describe the same run (a directory with trainer_state.json, TensorBoard events
and the stdout log), the numbers come from the most precise one and the others contribute only their
events and facts (OVERFLOW lines, warnings, the DeepSpeed config dump), so no step is counted twice.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lossguard.core.records import Record
from lossguard.sources.base import Source, SourceError
from lossguard.sources.lossguard_events import LossguardEventsSource
from lossguard.sources.mlflow_store import MlflowSource
from lossguard.sources.structured import CsvSource, JsonLinesSource, TrainerStateSource
from lossguard.sources.table import TableSource
from lossguard.sources.tensorboard_events import TensorBoardSource
from lossguard.sources.text_log import TextLogSource
from lossguard.sources.wandb_offline import WandbOfflineSource

if TYPE_CHECKING:
    from lossguard.sources.gather import Gathering

# Most precise first. A module that adds a source inserts it here.
SOURCES: list[Source] = [LossguardEventsSource(), TrainerStateSource(), TensorBoardSource(), MlflowSource(),
                         WandbOfflineSource(), JsonLinesSource(), CsvSource(), TableSource(), TextLogSource()]

SKIP_SUFFIXES = {".bin", ".pt", ".pth", ".safetensors", ".ckpt", ".npy", ".npz", ".pkl", ".png", ".jpg",
                  ".html", ".py", ".sh", ".md", ".yaml", ".yml", ".model", ".gz", ".zip", ".tar"}
SKIP_NAMES = {"config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
               "generation_config.json", "adapter_config.json", "latest", "zero_to_fp32.py", "meta.json",
               "vocab.json", "merges.txt"}
CHECKPOINT = re.compile(r"checkpoint-(\d+)$")
_HEAD_BYTES = 64 << 10


@dataclass(slots=True)
class Input:
    path: Path
    source: Source
    label: str = ""  # the name the user gave (a pipe is read from its spooled copy)

    def __post_init__(self) -> None:
        self.label = self.label or str(self.path)


def sniff(path: Path) -> Source | None:
    try:
        with open(path, "rb") as handle:
            head = handle.read(_HEAD_BYTES)
    except OSError as exc:
        raise SourceError(f"{path}: cannot read ({exc.strerror})") from None
    if not head:
        return None
    for source in SOURCES:
        if source.sniff(path, head):
            return source
    return None


def discover(paths: list[str], gathering: Gathering | None = None) -> list[Input]:
    """The inputs of PATH... (files, directories, `-`, pipes): each read once (see `sources/gather.py`)."""
    from lossguard.sources.gather import discover_inputs

    return discover_inputs(paths, gathering)


def records(inputs: list[Input], gathering: Gathering | None = None) -> Iterator[Record]:
    """All inputs as one stream, the numbers of several sources merged on the run's steps."""
    from lossguard.sources.gather import merged_records

    return merged_records(inputs, gathering)
