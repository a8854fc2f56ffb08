"""The sources, most precise first, and how a file is matched to one (`sniff`).

It sits apart from the package `__init__` so that the gatherer (`sources/gather.py`) and the package can
both import it without importing each other. No source module imports it: the list names them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from lossguard.sources.base import Source, SourceError
from lossguard.sources.lossguard_events import LossguardEventsSource
from lossguard.sources.mlflow_store import MlflowSource
from lossguard.sources.structured import CsvSource, JsonLinesSource, TrainerStateSource
from lossguard.sources.table import TableSource
from lossguard.sources.tensorboard_events import TensorBoardSource
from lossguard.sources.text_log import TextLogSource
from lossguard.sources.wandb_offline import WandbOfflineSource

# Most precise first: when several sources describe one run, the numbers come from the first. A new source
# is one more entry here, at its rank.
SOURCES: list[Source] = [
    LossguardEventsSource(),
    TrainerStateSource(),
    TensorBoardSource(),
    MlflowSource(),
    WandbOfflineSource(),
    JsonLinesSource(),
    CsvSource(),
    TableSource(),
    TextLogSource(),
]

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
