"""Quarantined samples (`recover=True`, tier 2): who they are, where they are kept, how a batch sheds them.

A sample is named by a hash of its token ids (the same tokens anywhere are the same poison, whatever the
rank or the epoch), its position in the micro-batch, and its dataset index when the batch carries one (an
`index` or `idx` key, one integer per sample). The file `quarantine.jsonl` in the events dir holds one
identity per line; rank 0 writes it (every rank learned the same identities from one exchange), and a new
`Guard` on the same events dir reads it, so a quarantined sample stays out after a resume too.

A batch here is a dict of tensors, or a tuple / list of tensors, whose first dimension is the sample; any
other shape passes through untouched (nothing can be named in it, nothing is dropped).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch

FILE = "quarantine.jsonl"
_ID_KEYS = ("input_ids", "ids", "tokens", "input")
_INDEX_KEYS = ("index", "idx")


def token_ids(batch: Any) -> torch.Tensor | None:
    """The batch's token ids: a known key, else the first integer tensor that is not the labels."""
    if isinstance(batch, dict):
        for key in _ID_KEYS:
            if isinstance(batch.get(key), torch.Tensor):
                return batch[key]
        items = [v for k, v in batch.items() if k not in ("labels", *_INDEX_KEYS)]
    elif isinstance(batch, (tuple, list)):
        items = list(batch)
    else:
        return None
    return next((v for v in items if isinstance(v, torch.Tensor) and v.dim() >= 1
                 and not v.is_floating_point()), None)


def sample_hash(ids: torch.Tensor) -> str:
    """A stable hash of one sample's token ids (int64, row-major): 16 hex digits of SHA-256."""
    data = ids.detach().to("cpu", torch.int64).contiguous().numpy().tobytes()
    return hashlib.sha256(data).hexdigest()[:16]


def num_samples(batch: Any) -> int:
    ids = token_ids(batch)
    return int(ids.shape[0]) if ids is not None else 0


def dataset_indices(batch: Any) -> list[int | None]:
    """Each sample's dataset index where the batch carries it (`index` / `idx`), else None for each."""
    size = num_samples(batch)
    if isinstance(batch, dict):
        for key in _INDEX_KEYS:
            value = batch.get(key)
            if isinstance(value, torch.Tensor) and value.numel() == size:
                return [int(v) for v in value.reshape(-1).tolist()]
    return [None] * size


def identities(batch: Any, positions: list[int], *, step: int, rank: int, why: str) -> list[dict[str, Any]]:
    """The identity of each sample at `positions`, as the event and the quarantine file keep it."""
    ids, indices = token_ids(batch), dataset_indices(batch)
    return [{"rank": rank, "position": p, "hash": sample_hash(ids[p]), "index": indices[p], "step": step,
             "why": why} for p in positions]


def select(batch: Any, positions: list[int]) -> Any:
    """The batch restricted to the samples at `positions` (every tensor with the batch's first dimension)."""
    size = num_samples(batch)
    keep = torch.tensor(positions, dtype=torch.long)

    def cut(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == size:
            return value.index_select(0, keep.to(value.device))
        return value

    if isinstance(batch, dict):
        return {k: cut(v) for k, v in batch.items()}  # a plain dict: what `model(**batch)` takes
    if isinstance(batch, (tuple, list)):
        return type(batch)(cut(v) for v in batch)
    return batch


class Quarantine:
    """The quarantined identities of this run: hashes and dataset indices, read from and kept in a file."""

    def __init__(self, events_dir: str | Path | None) -> None:
        self.path = Path(events_dir) / FILE if events_dir is not None else None
        self.entries: list[dict[str, Any]] = []
        self.hashes: set[str] = set()
        self.indices: set[int] = set()
        if self.path is not None and self.path.exists():
            for line in self.path.read_text().splitlines():
                try:
                    self._keep(json.loads(line))
                except (ValueError, TypeError):
                    continue  # a line cut short by a crash names nothing: the rest still hold

    def _keep(self, entry: dict[str, Any]) -> None:
        self.entries.append(entry)
        if isinstance(entry.get("hash"), str):
            self.hashes.add(entry["hash"])
        if isinstance(entry.get("index"), int):
            self.indices.add(entry["index"])

    def add(self, entries: list[dict[str, Any]], *, write: bool) -> None:
        """Keep `entries`; `write` (rank 0 only: every rank holds the same ones) appends them to the file."""
        entries = [e for e in entries if e.get("hash") not in self.hashes]  # named once, kept once
        for entry in entries:
            self._keep(entry)
        if write and self.path is not None and entries:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a") as fh:
                fh.write("".join(json.dumps(e, sort_keys=True) + "\n" for e in entries))
                fh.flush()
                os.fsync(fh.fileno())

    def kept(self, batch: Any) -> list[int] | None:
        """The positions of the samples not quarantined; None when every one may stay (the common case: an
        empty quarantine costs nothing, not even a hash)."""
        if not self.hashes and not self.indices:
            return None
        ids = token_ids(batch)
        if ids is None:
            return None
        indices = dataset_indices(batch)
        keep = [p for p in range(int(ids.shape[0]))
                if sample_hash(ids[p]) not in self.hashes and indices[p] not in self.indices]
        return None if len(keep) == ids.shape[0] else keep


def without_quarantined(batch: Any, held: Quarantine) -> Any:
    """`batch` without its quarantined samples. A batch whose every sample is quarantined still comes out,
    on every rank alike (the ranks must step together), with its labels masked: the gate holds that step."""
    keep = held.kept(batch)
    if keep:
        return select(batch, keep)
    if keep == [] and isinstance(batch, dict) and isinstance(batch.get("labels"), torch.Tensor):
        return {**batch, "labels": torch.full_like(batch["labels"], -100)}
    return batch
