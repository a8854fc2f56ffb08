"""The step summary: what every rank learns from one reduction of all ranks' rows, and what it decides.

Above `GuardOptions.detail_every_step_up_to` ranks, a step costs every rank the same whatever the world
size: each rank turns its row (monitor/wire.py) into its contribution, the contributions are all-reduced
(`dist.reduce_summary`), and the summary says, per slot of the row: the sum of the finite values, how many
ranks measured it, how many of those were non-finite or exactly zero, and the largest and smallest finite
value; plus how many ranks failed (the ERROR slot). Every rank holds the same summary, so every rank
reaches the same `reasons` to look closer (then all of them gather the rows, as below the threshold) and
the same run-level record when there is none.

`contributions` also reduces a stack of rows on the host (the rows one gather returned, or a bench's
simulated ones) to the numbers an all_reduce of the single rows gives.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from lossguard.core.profile import SPIKE_RECOVER_WITHIN
from lossguard.core.records import Record
from lossguard.monitor import wire
from lossguard.monitor.wire import (
    ERROR,
    FINGERPRINT,
    GRAD_NORM,
    GRAD_SQ,
    LABELS,
    LOSS_SCALE,
    MIN_LABELS,
    NUM_BASE,
    PRESENT,
    RAW_LOSS,
    SKIPPED,
)

# Steps still looked at in detail after one that showed something: a rank's own detectors then see how
# its fault went on (a spike coming back down within SPIKE_RECOVER_WITHIN logs, a NaN norm followed by a
# finite one), and every per-rank streak is broken by a clean record of that rank before the run goes
# back to run-level records.
DETAIL_AFTER = SPIKE_RECOVER_WITHIN
# A rank's loss this far from the mean of all ranks (and at least this many times the mean's size) is
# looked at rank by rank: the loss profile's spike is 3x a rank's own average and half a nat above it, so
# a rank at twice the run's mean is the earliest it can become one (core/profile.py).
OUTLIER_NATS = 0.5
# Slots where a non-finite value, or an exact zero, is a reason to look at every rank.
_NAMES = {RAW_LOSS: "loss", LABELS: "label tokens", MIN_LABELS: "fewest label tokens", GRAD_NORM: "grad norm",
          LOSS_SCALE: "loss scale", SKIPPED: "skipped steps", FINGERPRINT: "fingerprint", NUM_BASE: "lr"}
_ZERO_MATTERS = (RAW_LOSS, LABELS, MIN_LABELS, GRAD_NORM)
_PARTS = 6  # per slot: finite sum, ranks present, non-finite, zero (SUM) and max, -min (MAX); + errors


def length(layout: wire.Layout) -> int:
    """Floats in a reduced summary."""
    return _PARTS * layout.length + 1


@functools.lru_cache(maxsize=64)
def _bits(layout: wire.Layout, device: torch.device) -> torch.Tensor:
    """Each slot's PRESENT bit, on the device: copied there once per run, not per step."""
    return torch.tensor(wire.slot_bits(layout), dtype=torch.int64).to(device)


def contributions(layout: wire.Layout, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the part to reduce with SUM, the part to reduce with MAX) of one row, or of a stack of rows (one
    per rank) already reduced over them. On the device, without a host sync."""
    rows = rows.reshape(-1, layout.length)
    bits = torch.nan_to_num(rows[:, wire.PRESENT], nan=0.0).to(torch.int64)  # a failed row: nothing present
    present = (bits.unsqueeze(1) & _bits(layout, rows.device)) != 0
    measured = present & torch.isfinite(rows)
    flags = torch.stack([present, present & ~measured, present & (rows == 0)]).to(rows.dtype)
    counted = torch.cat([torch.where(measured, rows, 0.0).unsqueeze(0), flags])
    errors = (rows[:, wire.ERROR] == 1.0).to(rows.dtype).sum(0, keepdim=True)
    sums = torch.cat([counted.sum(1).reshape(-1), errors])
    # Non-finite and absent values become -inf first: a NaN through MAX would reach every rank.
    maxes = torch.where(measured, torch.stack([rows, -rows]), -math.inf).amax(1).reshape(-1)
    return sums, maxes


def reduce_on_host(layout: wire.Layout, rows: list[list[float]]) -> list[float]:
    """What `dist.reduce_summary` returns for these rows (one a rank), reduced on the host: host tensors,
    no device sync. For the steps that gathered instead of reducing, and for a simulated world."""
    sums, maxes = contributions(layout, torch.tensor(rows, dtype=torch.float64))
    return [*sums.tolist(), *maxes.tolist()]


def of_rows(layout: wire.Layout, rows: list[list[float]]) -> Summary:
    return Summary.read(layout, reduce_on_host(layout, rows))


@dataclass(frozen=True, slots=True)
class Summary:
    layout: wire.Layout
    total: list[float]  # per slot: sum of the finite values
    present: list[float]  # ranks that measured the slot
    nonfinite: list[float]
    zeros: list[float]
    high: list[float]  # largest finite value (-inf: none)
    low: list[float]  # smallest finite value (inf: none)
    errors: float  # ranks whose lossguard failed

    @classmethod
    def read(cls, layout: wire.Layout, values: list[float]) -> Summary:
        """The reduced floats, in the order `contributions` lays them out."""
        n = layout.length
        part = [values[i * n:(i + 1) * n] for i in range(4)]
        high = values[4 * n + 1:5 * n + 1]
        low = [-v for v in values[5 * n + 1:6 * n + 1]]
        return cls(layout, *part, high, low, values[4 * n])

    def has(self, slot: int) -> bool:
        return self.present[slot] > 0

    def value(self, slot: int) -> float:
        """The value all ranks agree on exactly, else the mean of the finite ones (NaN: none)."""
        if self.high[slot] == self.low[slot]:
            return self.high[slot]
        finite = self.present[slot] - self.nonfinite[slot]
        return self.total[slot] / finite if finite else math.nan

    def skip_range(self) -> tuple[float, float] | None:
        return (self.low[SKIPPED], self.high[SKIPPED]) if self.has(SKIPPED) else None


def fold_shard_norm(summary: Summary) -> Summary:
    """The reduced summary with the run's gradient norm in the GRAD_NORM slot where ranks sent their shards'
    squared norms (FSDP; `wire.fold_shard_norms` does the same for gathered rows): sqrt(their sum + the
    replicated gradients' norm squared), the one value every sharded rank reports. A non-finite part makes
    the norm non-finite on every rank that sent one, which `reasons` then looks at rank by rank."""
    if not summary.has(GRAD_SQ):
        return summary
    ranks = summary.present[GRAD_SQ]
    replicated = summary.value(GRAD_NORM) ** 2 if summary.has(GRAD_NORM) else 0.0
    norm = math.sqrt(summary.total[GRAD_SQ] + replicated) if not summary.nonfinite[GRAD_SQ] else math.nan
    finite = math.isfinite(norm)
    lists = (summary.total, summary.present, summary.nonfinite, summary.zeros, summary.high, summary.low)
    values = (norm * ranks if finite else 0.0, ranks, 0.0 if finite else ranks, ranks if norm == 0 else 0.0,
              norm if finite else -math.inf, norm if finite else math.inf)
    for column, value in zip(lists, values):
        column[GRAD_NORM] = value
    return summary


def own_row(row: list[float], summary: Summary) -> list[float]:
    """A rank's own row of a summary-only step, as its events file gets it: a sharded rank's (FSDP) with the
    run's gradient norm, as a gathered row has it; any other as it is."""
    if wire.sharded_row(row) and summary.has(GRAD_NORM):
        return wire.with_grad_norm(row, summary.value(GRAD_NORM))
    return row


def reasons(summary: Summary, last_skips: tuple[float, float] | None) -> list[str]:
    """Why this step must be looked at rank by rank (empty: the run-level record says it all). Decided
    from the summary alone, so every rank gives the same answer. `last_skips`: the previous step's
    (fewest, most) skipped steps."""
    out = [f"{int(summary.errors)} rank(s) failed"] if summary.errors else []
    out += [f"non-finite {name}" for slot, name in _NAMES.items() if summary.nonfinite[slot]]
    out += [f"zero {_NAMES[slot]}" for slot in _ZERO_MATTERS if summary.zeros[slot]]
    if summary.has(FINGERPRINT) and summary.high[FINGERPRINT] != summary.low[FINGERPRINT]:
        out.append("fingerprints differ")
    if summary.has(RAW_LOSS) and summary.present[RAW_LOSS] > summary.nonfinite[RAW_LOSS]:
        mean = summary.total[RAW_LOSS] / (summary.present[RAW_LOSS] - summary.nonfinite[RAW_LOSS])
        far = max(abs(mean), OUTLIER_NATS)
        if summary.high[RAW_LOSS] - mean > far or mean - summary.low[RAW_LOSS] > far:
            out.append("a rank's loss far from the mean")
    skips = summary.skip_range()
    if skips is not None and (skips[0] != skips[1] or (last_skips is not None and skips != last_skips)):
        out.append("skipped steps moved")
    return out


def standouts(layout: wire.Layout, rows: list[list[float]] | torch.Tensor, seen: Summary) -> list[int]:
    """The ranks whose own row shows something `reasons` looks for: a failed rank, a non-finite value or a
    zero where one matters, a loss far from the mean, a fingerprint or a skipped-step count other than most
    ranks'. One pass of tensor operations over every row, so a step gathered at thousands of ranks hands
    the detectors these few records, not one per rank. The same on every rank (the same rows)."""
    matrix = torch.as_tensor(rows, dtype=torch.float64).reshape(-1, layout.length)
    bits = torch.nan_to_num(matrix[:, PRESENT], nan=0.0).to(torch.int64)
    present = (bits.unsqueeze(1) & _bits(layout, matrix.device)) != 0
    odd = (matrix[:, ERROR] == 1.0) | (present & ~torch.isfinite(matrix))[:, list(_NAMES)].any(1)
    odd |= (present & (matrix == 0))[:, list(_ZERO_MATTERS)].any(1)
    for slot in (FINGERPRINT, SKIPPED):  # values every rank should share: the ranks off the most common
        has = present[:, slot]
        if has.any() and seen.high[slot] != seen.low[slot]:
            odd |= has & (matrix[:, slot] != _most_common(matrix[has, slot]))
    finite = seen.present[RAW_LOSS] - seen.nonfinite[RAW_LOSS]
    if finite:
        mean = seen.total[RAW_LOSS] / finite
        odd |= present[:, RAW_LOSS] & ((matrix[:, RAW_LOSS] - mean).abs() > max(abs(mean), OUTLIER_NATS))
    return torch.nonzero(odd).flatten().tolist()


def _most_common(values: torch.Tensor) -> torch.Tensor:
    """The value most ranks hold; on a tie (two ranks, two values), the lowest rank's: the reference a
    rank-by-rank comparison takes anyway."""
    distinct, counts = torch.unique(values, return_counts=True)
    tied = distinct[counts == counts.max()]
    return values[torch.isin(values, tied)][0]


def run_record(summary: Summary, step: int) -> Record:
    """The step as one run-level record (rank None), in the signals a rank's record uses: the loss, grad
    norm, loss scale and learning rates every rank agrees on (their mean where they do not), the step's
    label tokens summed over the ranks and the fewest of any micro-batch, the most skipped steps, the
    largest update ratio per group. No fingerprint: comparing replicas is per rank (those steps gather)."""
    signals: dict[str, float] = {}
    data: dict = {}
    if summary.has(RAW_LOSS):
        signals["raw_loss"] = signals["loss"] = summary.value(RAW_LOSS)
    if summary.has(LABELS):
        signals["num_label_tokens"], signals["min_label_tokens"] = summary.total[LABELS], summary.low[MIN_LABELS]
    for slot, name in ((GRAD_NORM, "grad_norm"), (LOSS_SCALE, "loss_scale")):
        if summary.has(slot):
            signals[name] = summary.value(slot)
    if summary.has(SKIPPED):
        signals["skipped_steps"] = summary.high[SKIPPED]
    layout = summary.layout
    if summary.has(NUM_BASE):
        data["lr_groups"] = [summary.value(NUM_BASE + i) for i in range(layout.num_lr)]
        signals["lr"] = data["lr_groups"][0]
    first = NUM_BASE + layout.num_lr
    if layout.groups and summary.has(first):
        ratios = [summary.high[first + i] for i in range(len(layout.groups))]
        ratios = [r if math.isfinite(r) else math.nan for r in ratios]  # -inf: no rank sampled the group
        finite = [r for r in ratios if math.isfinite(r)]
        signals["update_ratio"] = max(finite) if finite else math.nan
        data["update_ratio_groups"] = dict(zip(layout.groups, ratios))
    return Record(step=step, rank=None, signals=signals, data=data, source="live")


def ranks_to_feed(layout, step: int, rows: list[list[float]], seen: Summary, watched: dict[int, int]) -> list[int]:
    """The ranks that stand out at this step, those that stood out in the last DETAIL_AFTER steps (their
    detectors see how the fault went on, and a clean record ends their streaks), and a reference first: the
    lowest rank that does not stand out, which rank-to-rank comparisons (a replica's fingerprint) measure the
    others against. `watched` (rank -> the last step it stood out) is updated in place."""
    for rank in standouts(layout, rows, seen):
        watched[rank] = step
    for rank in [r for r, at in watched.items() if step - at > DETAIL_AFTER]:
        del watched[rank]
    if not watched:
        return []
    reference = next((r for r in range(len(rows)) if r not in watched), None)
    return ([] if reference is None else [reference]) + sorted(watched)
