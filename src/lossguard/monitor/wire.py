"""The per-rank vector every rank sends at each optimizer step, and how a gathered row reads back.

One fixed-length float64 vector a rank, so the step's collectives (`dist.gather_rows`, and above the
world-size threshold the summary's all_reduce, monitor/summary.py) have the same shape on every rank:
ten base slots, then `num_lr` learning rates, then one update ratio per module group. The PRESENT slot
says which optional signals the rank measured at this step (a bit each); absent slots are NaN.
The ERROR slot set means "this rank's lossguard failed": the row carries nothing else (every slot NaN).

`encode` builds the vector on the communication device without a host sync (values may be 0-d tensors;
the Python numbers travel as one tensor, one copy);
`decode` turns one gathered row (Python floats) back into signals and data. `decode(encode(x)) == x`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from lossguard.core.records import Record

RAW_LOSS, LABELS, MIN_LABELS, GRAD_NORM, LOSS_SCALE, SKIPPED, FINGERPRINT, ERROR, PRESENT, GRAD_SQ = range(10)
NUM_BASE = 10
# Bits of the PRESENT slot: which optional signals this rank measured at this step.
HAS_LOSS, HAS_LABELS, HAS_GRAD_NORM, HAS_SCALE, HAS_SKIPPED, HAS_PRINT, HAS_UPDATE, HAS_LR = (1 << i for i in range(8))
# Not a signal: this rank's batch held only quarantined samples (monitor/quarantine.py `shed`); every rank
# skips the step (monitor/recover.py). Sent with no label token, so a summarised step gathers its rows.
EMPTIED = 1 << 8
# GRAD_SQ: the squared gradient norm of the shards this rank holds (FSDP, monitor/sharding.py), its share of
# a sum over the ranks. `fold_shard_norms` turns the gathered rows' parts into the run's gradient norm, the
# one FSDP's own `clip_grad_norm_` computes, with no collective beyond the step's exchange.
HAS_GRAD_SQ = 1 << 9

# (slot, bit, signal name) of the single-value optional signals.
_SCALARS = ((GRAD_NORM, HAS_GRAD_NORM, "grad_norm"), (LOSS_SCALE, HAS_SCALE, "loss_scale"),
            (SKIPPED, HAS_SKIPPED, "skipped_steps"))


def _assemble(slots: list[Any], device: torch.device) -> torch.Tensor:
    """The vector on `device` with one host-to-device copy: the Python numbers go over as one tensor, the
    values already on the device (0-d tensors) are written into it there. A copy per Python number would
    be a transfer the host waits for, each step, per slot."""
    host = [math.nan] * len(slots)
    where, measured = [], []
    for i, value in enumerate(slots):
        # A value already on the device stays there; a number, or a CPU tensor beside a GPU vector (read
        # where it is: no device to wait for), goes over with the host vector.
        if isinstance(value, torch.Tensor) and (value.device == device or value.device.type != "cpu"):
            where.append(i)
            measured.append(value.detach().reshape(()).to(device=device, dtype=torch.float64))
        else:
            host[i] = float(value)
    vector = torch.tensor(host, dtype=torch.float64)
    if device.type == "cuda":
        # From page-locked memory the copy is queued on the stream and the host goes on; from ordinary memory
        # it is a synchronous copy, a stall each step (PyTorch's pinned-block cache keeps the block until the
        # copy is done, and makes pinning a few floats each step cheap).
        vector = vector.pin_memory().to(device, non_blocking=True)
    else:
        vector = vector.to(device)
    if measured:
        vector = vector.index_copy(0, _slot_index(tuple(where), device), torch.stack(measured))
    return vector


@functools.lru_cache(maxsize=64)
def _slot_index(where: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """The slots the device values go to, on the device: copied there once per set of slots, not per step."""
    return torch.tensor(where, dtype=torch.long).to(device)


@dataclass
class StepValues:
    """One rank's measurements for one step; None (or an empty list) means not measured."""

    raw_loss: Any = None
    num_label_tokens: Any = None
    min_label_tokens: Any = None
    grad_norm: Any = None
    loss_scale: Any = None
    skipped_steps: Any = None
    param_fingerprint: Any = None
    lrs: list[Any] = field(default_factory=list)
    update_ratios: list[Any] | None = None
    emptied: bool = False  # the quarantine left this rank's batch empty
    grad_sq_shard: Any = None  # FSDP: this rank's share of the squared gradient norm (GRAD_SQ)


def put_micro(values: StepValues, micro: list[tuple[Any, Any, Any]], device: torch.device) -> None:
    """The step's loss and label counts from its micro-batches' (loss, label tokens, weight), on `device`.
    Weighted (a per-token sum and its token count each): the per-token mean; else the mean of the losses."""
    losses = [(loss, w) for loss, _, w in micro if loss is not None]
    if losses:
        total = torch.stack([loss.to(device) for loss, _ in losses])
        if all(w is not None for _, w in losses):
            weight = torch.stack([w.to(device) for _, w in losses]).sum()
            values.raw_loss = torch.where(weight > 0, total.sum() / weight.clamp_min(1.0), total.sum())
        else:
            values.raw_loss = total.mean()
    counts = [tok for _, tok, _ in micro if tok is not None]
    if counts:
        stacked = torch.stack([c.to(device) for c in counts])
        values.num_label_tokens, values.min_label_tokens = stacked.sum(), stacked.min()


@dataclass(frozen=True)
class Layout:
    """The vector's shape for one run: how many learning rates and which module groups."""

    num_lr: int
    groups: tuple[str, ...]

    @property
    def length(self) -> int:
        return NUM_BASE + self.num_lr + len(self.groups)

    def encode(self, values: StepValues, device: torch.device) -> torch.Tensor:
        slots: list[Any] = [math.nan] * self.length
        present = 0
        if values.raw_loss is not None:
            slots[RAW_LOSS] = values.raw_loss
            present |= HAS_LOSS
        if values.num_label_tokens is not None:
            slots[LABELS], slots[MIN_LABELS] = values.num_label_tokens, values.min_label_tokens
            present |= HAS_LABELS
        for slot, bit, name in _SCALARS:
            value = getattr(values, name)
            if value is not None:
                slots[slot] = value
                present |= bit
        if values.lrs:
            for i, lr in enumerate(values.lrs[: self.num_lr]):
                slots[NUM_BASE + i] = lr
            present |= HAS_LR
        if values.param_fingerprint is not None:
            slots[FINGERPRINT] = values.param_fingerprint
            present |= HAS_PRINT
        if values.update_ratios is not None:
            for i, ratio in enumerate(values.update_ratios):
                slots[NUM_BASE + self.num_lr + i] = ratio
            present |= HAS_UPDATE
        if values.grad_sq_shard is not None:
            slots[GRAD_SQ] = values.grad_sq_shard
            present |= HAS_GRAD_SQ
        if values.emptied:
            slots[LABELS], slots[MIN_LABELS] = 0.0, 0.0
            present |= HAS_LABELS | EMPTIED
        slots[ERROR] = 0.0
        slots[PRESENT] = float(present)
        return _assemble(slots, device)

    def error_vector(self, device: torch.device) -> torch.Tensor:
        vector = torch.full((self.length,), math.nan, dtype=torch.float64, device=device)
        vector[ERROR] = 1.0
        return vector

    def decode(self, row: list[float]) -> tuple[dict[str, float], dict[str, Any]]:
        """(signals, data) of one gathered row; `data` holds the per-group detail behind `lr`/`update_ratio`."""
        present = int(row[PRESENT])
        signals: dict[str, float] = {}
        data: dict[str, Any] = {}
        if present & HAS_LOSS:
            signals["raw_loss"] = signals["loss"] = row[RAW_LOSS]
        if present & HAS_LABELS:
            signals["num_label_tokens"], signals["min_label_tokens"] = row[LABELS], row[MIN_LABELS]
        for slot, bit, name in _SCALARS:
            if present & bit:
                signals[name] = row[slot]
        if present & HAS_LR:
            lrs = row[NUM_BASE: NUM_BASE + self.num_lr]
            signals["lr"] = lrs[0]
            data["lr_groups"] = lrs
        if present & HAS_PRINT:
            signals["param_fingerprint"] = row[FINGERPRINT]
        if present & HAS_UPDATE:
            ratios = row[NUM_BASE + self.num_lr:]
            finite = [r for r in ratios if math.isfinite(r)]
            signals["update_ratio"] = max(finite) if finite else math.nan
            data["update_ratio_groups"] = dict(zip(self.groups, ratios))
        return signals, data


def slot_bits(layout: Layout) -> tuple[int, ...]:
    """The PRESENT bit that says whether each slot of a row holds a measurement (0: never one; the ERROR
    and PRESENT slots are bookkeeping). The summary (monitor/summary.py) counts ranks per slot by it."""
    base = {RAW_LOSS: HAS_LOSS, LABELS: HAS_LABELS, MIN_LABELS: HAS_LABELS, GRAD_NORM: HAS_GRAD_NORM,
            LOSS_SCALE: HAS_SCALE, SKIPPED: HAS_SKIPPED, FINGERPRINT: HAS_PRINT, GRAD_SQ: HAS_GRAD_SQ}
    return (*(base.get(slot, 0) for slot in range(NUM_BASE)), *(HAS_LR,) * layout.num_lr,
            *(HAS_UPDATE,) * len(layout.groups))


def _has(row: list[float], bit: int) -> bool:
    bits = row[PRESENT]
    return bits == bits and bool(int(bits) & bit)


def fold_shard_norms(rows: list[list[float]]) -> list[list[float]]:
    """The gathered rows with each sharded rank's GRAD_NORM set to the run's gradient norm:
    sqrt(sum over the ranks of GRAD_SQ + the rank's own norm of the replicated gradients, squared). Summed in
    rank order, so every rank gets the same bits; a NaN or inf in any rank's part reaches every rank's
    norm. In place; the rows."""
    parts = [row[GRAD_SQ] for row in rows if _has(row, HAS_GRAD_SQ)]
    if not parts:
        return rows
    total = 0.0
    for part in parts:
        total += part
    for row in rows:
        if not _has(row, HAS_GRAD_SQ):
            continue
        replicated = row[GRAD_NORM] ** 2 if _has(row, HAS_GRAD_NORM) else 0.0
        square = total + replicated
        row[GRAD_NORM] = math.sqrt(square) if square >= 0 else math.nan  # NaN fails the test: NaN
        row[PRESENT] = float(int(row[PRESENT]) | HAS_GRAD_NORM)
    return rows


def sharded_row(row: list[float]) -> bool:
    """The row holds a share of a sharded gradient norm (GRAD_SQ)."""
    return _has(row, HAS_GRAD_SQ)


def with_grad_norm(row: list[float], norm: float) -> list[float]:
    """A copy of `row` carrying `norm` as its gradient norm (a summary-only step's run norm, for the rank's file)."""
    out = list(row)
    out[GRAD_NORM] = norm
    out[PRESENT] = float(int(out[PRESENT]) | HAS_GRAD_NORM)
    return out


def emptied(row: list[float]) -> bool:
    """The sending rank's batch held only quarantined samples."""
    return _has(row, EMPTIED)


def failed(row: list[float]) -> bool:
    """The sending rank's lossguard failed (its row carries no signals)."""
    return bool(row[ERROR])


def mark_scaler_overflow(signals: dict[str, float], data: dict[str, Any]) -> None:
    """A row of a dynamic loss scaler with no skip counter (torch.amp's GradScaler under Guard or
    Lightning): a non-finite norm beside a finite loss is an overflow the scaler skips (the gate lets it
    through to it, monitor/recover.py), not a measurement: marked as a skipped step, the norm set aside."""
    if "loss_scale" in signals and not math.isfinite(signals.get("grad_norm", 0.0)) \
            and math.isfinite(signals.get("raw_loss", math.nan)):
        data["step_skipped"] = True
        data["grad_norm_reported"] = signals.pop("grad_norm")


def row_record(layout: Layout, step: int, rank: int, row: list[float], last_skipped: dict[int, float]) -> Record:
    """One rank's gathered row as a live record; `last_skipped` (each rank's skip count so far) is advanced."""
    signals, data = layout.decode(row)
    if (skipped := signals.get("skipped_steps")) is not None:
        if skipped > last_skipped.get(rank, 0.0) and "grad_norm" in signals:
            # the optimizer skipped this step (fp16 overflow, bf16 check_grad_overflow): DeepSpeed's
            # grad_norm is then its overflow marker (inf, or the last good value), not a measurement
            data["step_skipped"] = True
            data["grad_norm_reported"] = signals.pop("grad_norm")
        last_skipped[rank] = skipped
    else:  # no skip counter: a GradScaler's overflow, if any, is read from the norm
        mark_scaler_overflow(signals, data)
    return Record(step=step, rank=rank, signals=signals, data=data, source="live")
