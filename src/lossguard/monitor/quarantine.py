"""Quarantined samples (`recover=True`, tier 2): who they are, where they are kept, how a batch sheds them.

A sample is named by a hash of its token ids (the same tokens anywhere are the same poison, whatever the
rank or the epoch; where the batch carries an `attention_mask` of the ids' shape, only the tokens it keeps,
so the padding a collator adds to fit the sample's batch-mates does not change its name), its position in
the micro-batch, and its dataset index when the batch carries one (an `index` or `idx` key, one integer per
sample). The file `quarantine.jsonl` in the events dir holds one identity per line; rank 0 writes it (every
rank learned the same identities from one exchange), and a new `Guard` on the same events dir reads it, so a
quarantined sample stays out after a resume too.

A batch here is a mapping of tensors (a dict, or what the transformers collators return: a `BatchEncoding`,
a `UserDict`), with or without `labels`, or a tuple / list of tensors, whose first dimension is the sample;
a batch cut down is rebuilt as the same type. Any other shape passes through untouched (nothing can be
named in it, nothing is dropped).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

FILE = "quarantine.jsonl"
_ID_KEYS = ("input_ids", "ids", "tokens", "input")
_INDEX_KEYS = ("index", "idx")


def token_ids(batch: Any) -> torch.Tensor | None:
    """The batch's token ids: a known key, else the first integer tensor that is not the labels."""
    if isinstance(batch, Mapping):
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


def sample_hashes(batch: Any) -> list[str]:
    """Each sample's hash: its token ids, only those its attention mask keeps where the batch has one."""
    ids = token_ids(batch)
    if ids is None:
        return []
    mask = batch.get("attention_mask") if isinstance(batch, Mapping) else None
    if not isinstance(mask, torch.Tensor) or mask.shape != ids.shape or ids.dim() != 2:
        return [sample_hash(row) for row in ids]
    keep = mask.detach().to(ids.device) != 0
    return [sample_hash(row[kept]) for row, kept in zip(ids, keep)]


def num_samples(batch: Any) -> int:
    ids = token_ids(batch)
    return int(ids.shape[0]) if ids is not None else 0


def dataset_indices(batch: Any) -> list[int | None]:
    """Each sample's dataset index where the batch carries it (`index` / `idx`), else None for each."""
    size = num_samples(batch)
    if isinstance(batch, Mapping):
        for key in _INDEX_KEYS:
            value = batch.get(key)
            if isinstance(value, torch.Tensor) and value.numel() == size:
                return [int(v) for v in value.reshape(-1).tolist()]
    return [None] * size


def identities(batch: Any, positions: list[int], *, step: int, rank: int, why: str) -> list[dict[str, Any]]:
    """The identity of each sample at `positions`, as the event and the quarantine file keep it."""
    hashes, indices = sample_hashes(batch), dataset_indices(batch)
    return [{"rank": rank, "position": p, "hash": hashes[p], "index": indices[p], "step": step,
             "why": why} for p in positions]


def rebuilt(batch: Any, items: Any) -> Any:
    """`items` (a mapping's pairs, or a sequence's values) as a batch of `batch`'s own type: a `BatchEncoding`
    stays one (its `.to(device)` and attribute access still work), a namedtuple stays one. A mapping type
    that cannot be built from a dict comes back a dict: what `model(**batch)` takes either way."""
    if isinstance(batch, Mapping):
        data = dict(items)
        if type(batch) is dict:
            return data
        try:
            return type(batch)(data)
        except Exception:
            return data
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*items)
    return type(batch)(items)


def select(batch: Any, positions: list[int]) -> Any:
    """The batch restricted to the samples at `positions` (every tensor with the batch's first dimension)."""
    size = num_samples(batch)
    keep = torch.tensor(positions, dtype=torch.long)

    def cut(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == size:
            return value.index_select(0, keep.to(value.device))
        return value

    if isinstance(batch, Mapping):
        return rebuilt(batch, ((k, cut(v)) for k, v in batch.items()))
    if isinstance(batch, (tuple, list)):
        return rebuilt(batch, [cut(v) for v in batch])
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
        hashes, indices = sample_hashes(batch), dataset_indices(batch)
        keep = [p for p, (name, index) in enumerate(zip(hashes, indices))
                if name not in self.hashes and index not in self.indices]
        return None if len(keep) == len(hashes) else keep


def shed(batch: Any, held: Quarantine) -> tuple[Any, bool]:
    """(`batch` without its quarantined samples, whether none was left). A batch left empty comes back
    whole, its labels masked where it has them (`Shedder` hands out a stand-in instead)."""
    keep = held.kept(batch)
    if keep:
        return select(batch, keep), False
    if keep is None:
        return batch, False
    if isinstance(batch, Mapping) and isinstance(batch.get("labels"), torch.Tensor):
        batch = rebuilt(batch, {**batch, "labels": torch.full_like(batch["labels"], -100)}.items())
    return batch, True


class Shedder:
    """The batches of one loop without their quarantined samples. A batch left empty is replaced by a
    stand-in: the last batch this shedder let through on this rank (a quarantined sample never runs again),
    else the empty one whole, its labels masked. Every rank still runs the step's forward and backward
    (under DDP the backward all-reduces: a rank that skipped it alone would leave the others waiting); the
    caller says in the step's exchange that its batch was empty, and every rank skips that step alike
    (monitor/recover.py). Keeps one batch alive between steps: the last one let through."""

    def __init__(self, held: Quarantine) -> None:
        self.held = held
        self.last: Any = None

    def __call__(self, batch: Any) -> tuple[Any, bool]:
        """(the batch to hand out, whether this rank's batch was left empty)."""
        out, emptied = shed(batch, self.held)
        if not emptied:
            self.last = out
            return out, False
        return (self.last if self.last is not None else out), True


def without_quarantined(batch: Any, held: Quarantine) -> Any:
    """`batch` without its quarantined samples (`shed`, its first part)."""
    return shed(batch, held)[0]
