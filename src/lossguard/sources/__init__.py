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

from lossguard.core.records import EVENT, Record
from lossguard.sources.base import Source, SourceError
from lossguard.sources.lossguard_events import LossguardEventsSource
from lossguard.sources.structured import CsvSource, JsonLinesSource, TrainerStateSource
from lossguard.sources.tensorboard_events import TensorBoardSource
from lossguard.sources.text_log import TextLogSource

# Most precise first. A module that adds a source inserts it here.
SOURCES: list[Source] = [LossguardEventsSource(), TrainerStateSource(), TensorBoardSource(), JsonLinesSource(), CsvSource(), TextLogSource()]

_SKIP_SUFFIXES = {".bin", ".pt", ".pth", ".safetensors", ".ckpt", ".npy", ".npz", ".pkl", ".png", ".jpg",
                  ".html", ".py", ".sh", ".md", ".yaml", ".yml", ".model", ".gz", ".zip", ".tar"}
_SKIP_NAMES = {"config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
               "generation_config.json", "adapter_config.json", "latest", "zero_to_fp32.py", "meta.json",
               "vocab.json", "merges.txt"}
_CHECKPOINT = re.compile(r"checkpoint-(\d+)$")
_HEAD_BYTES = 64 << 10


@dataclass(slots=True)
class Input:
    path: Path
    source: Source


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


def discover(paths: list[str]) -> list[Input]:
    found: list[Input] = []
    for text in paths:
        path = Path(text)
        if not path.exists():
            raise SourceError(f"{text}: no such file or directory")
        if path.is_dir():
            found.extend(_walk(path))
            continue
        source = sniff(path)
        if source is None:
            raise SourceError(f"{text}: empty or not a training log (binary data or an unknown format); "
                              "pass the run's stdout log, trainer_state.json, a TensorBoard event file or "
                              "the output directory")
        found.append(Input(path, source))
    return found


def _walk(root: Path) -> list[Input]:
    files = [p for p in sorted(root.rglob("*")) if p.is_file() and _worth_reading(p)]
    # In an output dir with checkpoint-* folders, the top-level trainer_state.json (or else the latest
    # checkpoint's) holds the whole history; older checkpoints hold prefixes of it.
    states = [p for p in files if p.name == "trainer_state.json"]
    if len(states) > 1:
        keep = _best_state(root, states)
        files = [p for p in files if p.name != "trainer_state.json" or p == keep]
    inputs = []
    for path in files:
        source = sniff(path)
        if source is not None:
            inputs.append(Input(path, source))
    if not inputs:
        raise SourceError(f"{root}: no training log found in this directory (looked for *.log / *.txt stdout "
                          "logs, trainer_state.json, TensorBoard events, *.jsonl, *.csv); pass the log file itself")
    return inputs


def _worth_reading(path: Path) -> bool:
    if path.name in _SKIP_NAMES or path.suffix.lower() in _SKIP_SUFFIXES:
        return False
    return not any(part.startswith("global_step") for part in path.parts)


def _best_state(root: Path, states: list[Path]) -> Path:
    top = root / "trainer_state.json"
    if top in states:
        return top

    def checkpoint_number(path: Path) -> int:
        match = _CHECKPOINT.search(path.parent.name)
        return int(match.group(1)) if match else -1

    return max(states, key=checkpoint_number)


def records(inputs: list[Input]) -> Iterator[Record]:
    """All inputs as one stream: numbers from the most precise source kind, events from every input."""
    rank = {id(s): i for i, s in enumerate(SOURCES)}
    primary = min((rank.get(id(i.source), len(SOURCES)) for i in inputs), default=None)
    live = [i.path for i in inputs if isinstance(i.source, LossguardEventsSource)]
    if len(live) > 1:  # one file per rank: interleave by step so cross-rank detectors see a step together
        from lossguard.sources.lossguard_events import merged

        yield from merged(live)
        inputs = [i for i in inputs if not isinstance(i.source, LossguardEventsSource)]
        primary = min(primary or 0, 0)
    for item in sorted(inputs, key=lambda i: rank.get(id(i.source), len(SOURCES))):
        if rank.get(id(item.source), len(SOURCES)) == primary:
            yield from item.source.parse(item.path)
        else:
            yield from (record for record in item.source.parse(item.path) if record.kind == EVENT)
