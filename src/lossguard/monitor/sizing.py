"""Snapshots decided by the machine: `RecoverOptions(snapshot_every=None)`, the default.

At the first step every rank measures what one snapshot of its own state will hold on the host
(`snapshot_bytes`: the bytes of the tensors the ring copies, an Adam's moments counted before Adam makes them
at its first step), what a rollback needs on top at its peak (`restore_bytes`: `Ring.restore` hands a torch
optimizer a fresh host copy of its saved state; DeepSpeed's state is copied back in place, nothing extra),
and the host memory free to it (`free_bytes`: MemAvailable, or the cgroup's limit less its usage when that is
lower, divided among the ranks on the host: LOCAL_WORLD_SIZE, else the ranks that gathered the same host
name). Those numbers travel in the first step's `gather_objects`, which every rank makes anyway
(monitor/core.py); every rank then decides from the same gathered list (`plan`), so snapshots are on or off
alike on every rank with no collective of their own.

On, every AUTO_EVERY steps, when on every rank `keep` snapshots plus a rollback's peak take at most
HOST_SHARE of that rank's free memory; off otherwise. An explicit `snapshot_every` is kept as it is (a
warning in the line when it would not fit). Rank 0 prints the decision in one line, and every rank writes it
to its events file (`{"type":"snapshots", ...}`).
"""

from __future__ import annotations

import os
import socket
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from lossguard.monitor import snapshots
from lossguard.monitor.dtensor import local

# Ten steps bound what a rollback loses to ten steps' compute, and a copy every ten steps costs little.
AUTO_EVERY = 10
# The snapshots may take half of what is free: the rest is for what the run itself grows into after its
# first step (data loader workers and their prefetch, a checkpoint's host copy, pinned buffers, the page
# cache its data reads need).
HOST_SHARE = 0.5
# Optimizer state per parameter, in copies of the parameter, for the torch optimizers that make it lazily
# at their first step (before it, the state is not there to measure); others count as Adam does.
_COPIES = {"SGD": 1, "Adagrad": 1, "RMSprop": 1, "Adadelta": 2, "Rprop": 2, "LBFGS": 2}


def snapshot_bytes(model: Any, optimizer: Any) -> int:
    """The host bytes of one snapshot of `model` (Trainable / ShardState) and `optimizer`."""
    size = snapshots.nbytes(model.state_dict())
    if optimizer is not None:
        size += snapshots.nbytes(optimizer.state_dict()) + lazy_bytes(optimizer)
    return size


def restore_bytes(optimizer: Any) -> int:
    """The host bytes a rollback allocates on top of the ring at its peak: the fresh copy of the optimizer's
    saved state `Ring.restore` hands `load_state_dict` (none for one that copies back in place)."""
    if optimizer is None or getattr(optimizer, "copies_in_place", False):
        return 0
    return snapshots.nbytes(optimizer.state_dict()) + lazy_bytes(optimizer)


def lazy_bytes(optimizer: Any) -> int:
    """The state a torch optimizer will make at its first step for the parameters it holds none for yet (of
    an FSDP2 parameter, for this rank's shard)."""
    lazy = getattr(optimizer, "lazy_bytes", None)
    if lazy is not None:
        return lazy()
    if not isinstance(optimizer, torch.optim.Optimizer):
        return 0
    size = 0
    for group in optimizer.param_groups:
        name = type(optimizer).__name__
        copies = 0 if name == "SGD" and not group.get("momentum") else _COPIES.get(name, 2)
        copies += int(bool(group.get("momentum"))) + int(bool(group.get("centered"))) if name == "RMSprop" else 0
        size += sum(copies * local(p).numel() * p.element_size() for p in group["params"]
                    if p.requires_grad and p not in optimizer.state)
    return size


def free_bytes() -> int | None:
    """The host memory this machine (or this container's cgroup) can still give, None where unknown."""
    free = None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                         ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit) as a, open(usage) as b:
                cap = int(a.read().strip()) - int(b.read().strip())  # "max" (no limit): ValueError
        except (OSError, ValueError):
            continue
        if cap < 1 << 50:  # cgroup v1 writes a huge number for no limit
            free = cap if free is None else min(free, cap)
        break
    return free


def measure(state: Callable[[], tuple[Any, Any]] | None) -> dict[str, Any]:
    """This rank's numbers for `plan` (picklable); an error travels as text, never raised."""
    try:
        local = int(os.environ.get("LOCAL_WORLD_SIZE") or 0)
        out: dict[str, Any] = {"host": socket.gethostname(), "local": local, "free": free_bytes(),
                               "bytes": 0, "peak": 0}
        if state is not None:
            model, optimizer = state()
            out.update(bytes=snapshot_bytes(model, optimizer), peak=restore_bytes(optimizer))
        return out
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


@dataclass
class Plan:
    every: int
    line: str  # what rank 0 prints
    event: dict[str, Any]  # the events file's line


def plan(asked: int | None, keep: int, rows: list[dict[str, Any]], why_not: str | None = None,
         restores: str = "") -> Plan:
    """The decision from every rank's `measure` (the same list on every rank, so the same decision)."""
    errors = [f"rank {r}: {row['error']}" for r, row in enumerate(rows) if row.get("error")]
    good = [row for row in rows if not row.get("error")]
    hosts = Counter(row["host"] for row in good)
    shares = [row["free"] / (row["local"] or hosts[row["host"]]) if row["free"] is not None else None
              for row in good]
    size = max((row["bytes"] for row in good), default=0)
    peak = max((row["peak"] for row in good), default=0)
    known = [s for s in shares if s is not None]
    free = min(known) if known and len(known) == len(shares) else None
    fits = not errors and free is not None and \
        all(keep * row["bytes"] + row["peak"] <= HOST_SHARE * s for row, s in zip(good, shares))
    need = f"{keep} x {_size(size)} per rank" + (f", +{_size(peak)} at a rollback" if peak else "")
    room = f"{_size(free)} free per rank" if free is not None else "free host memory unknown"
    if why_not is not None:
        every, text = 0, f"snapshots off: {why_not}"
    elif asked == 0:
        every, text = 0, "snapshots off (snapshot_every=0)"
    elif asked is not None:
        every = asked
        text = f"snapshots every {asked} steps (snapshot_every={asked}), {need} ({room})"
        if not fits:
            text += f"; warning: more than {HOST_SHARE:.0%} of the free memory" if free is not None else \
                "; warning: whether they fit is not known"
    elif fits:
        every, text = AUTO_EVERY, f"snapshots every {AUTO_EVERY} steps, {need} ({room})"
    else:
        every = 0
        why = "; ".join(errors) if errors else room if free is None else \
            f"{need} would not fit in {HOST_SHARE:.0%} of {room}"
        text = (f"snapshots off: {_size(size)} per snapshot ({why}); enable with "
                f"RecoverOptions(snapshot_every=N), keep=1 to halve it")
    if every and restores:
        text += f"; a rollback restores {restores}"
    event = {"type": "snapshots", "every": every, "asked": asked, "keep": keep, "bytes": size,
             "restore_bytes": peak, "free_bytes_per_rank": free, "fits": fits, "text": f"lossguard: {text}"}
    return Plan(every, f"lossguard: {text}", event)


def _size(num: float | None) -> str:
    num = num or 0
    for unit in ("B", "KiB", "MiB", "GiB"):
        if num < 1024 or unit == "GiB":
            return f"{num:.0f} {unit}" if unit == "B" else f"{num:.1f} {unit}"
        num /= 1024
    return f"{num:.1f} TiB"


class Planner:
    """Set as `monitor.planner`: `local()` goes into the first step's gather, `decided(rows)` applies the
    plan (`apply(every)`) on every rank and tells it."""

    def __init__(self, monitor: Any, state: Callable[[], tuple[Any, Any]] | None,
                 apply: Callable[[int], str], why_not: str | None = None) -> None:
        self.monitor, self.state, self.apply, self.why_not = monitor, state, apply, why_not
        self.plan: Plan | None = None

    def local(self) -> dict[str, Any]:
        return measure(self.state if self.why_not is None else None)

    def decided(self, rows: list[Any]) -> None:
        options = self.monitor.gate.options
        rows = [row if isinstance(row, dict) else {"error": "no measurement"} for row in rows]
        draft = plan(options.snapshot_every, options.keep, rows, self.why_not)
        restores = self.apply(draft.every)  # what a rollback restores, now that the ring is there
        self.plan = plan(options.snapshot_every, options.keep, rows, self.why_not, restores)
        if self.monitor.jsonl is not None:
            self.monitor.jsonl.write({**self.plan.event, "rank_bytes": rows[self.monitor.rank].get("bytes")})
        if self.monitor.rank == 0 and self.monitor.options.console:
            from lossguard.monitor.sinks import say
            say(self.plan.line)
