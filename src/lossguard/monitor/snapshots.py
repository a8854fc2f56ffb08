"""Snapshots and rollback (`RecoverOptions(snapshot_every=S)`, tier 3): undo a fault the gate cannot stop.

A fault seen only after the step was applied (weights that turned non-finite) cannot be held: the state
is already bad. With snapshots on, every rank keeps a ring (`keep`, default 2) of host copies of its OWN
state, taken when `Guard.commit` lets step n through and n - 1 is a multiple of S (so the first is the
initial state): the model's state_dict, the optimizer's (Adam moments, step counts, param groups and their
LRs), the scheduler's when the Guard was given one, every RNG (`replay.capture_rng`) and the data position
(batches `Guard.batches` had handed out before step n). The step number decides, not communication: every
rank snapshots at the same step, with no collective. Cost on the host, per rank: a copy of the weights
and of the optimizer state, about 12 bytes per parameter for fp32 Adam (4 weights + 8 moments), times
`keep`.

When the gate holds a step and snapshots are on, every rank checks its own weights and its snapshots for
non-finite values and the ranks exchange that once (`gather_objects`, on the fault path only, entered by
every rank because the hold is decided from the gathered rows). Every rank reads the same list: when some
rank's weights are non-finite, every rank restores the newest snapshot whose weights are finite on every
rank, drops its gradients, and the loop goes on from the next batch (the batches since the snapshot are
skipped, not replayed: the data position moves on). No such snapshot: halt.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

from lossguard.monitor import dist, replay


def host_copy(value: Any) -> Any:
    """A detached host copy of a (nested) state dict: tensors cloned to the CPU, the rest copied."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: host_copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(host_copy(v) for v in value)
    return value


def nbytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(nbytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(nbytes(v) for v in value)
    return 0


def _finite(state: dict[str, Any]) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in state.values()
               if isinstance(t, torch.Tensor) and t.is_floating_point())


@dataclass
class Snapshot:
    step: int  # taken as step `step` was let through: the state after `step - 1` steps
    batches: int  # batches handed out before this step's batch
    model: dict[str, Any]
    optimizer: dict[str, Any] | None
    scheduler: dict[str, Any] | None
    rng: dict[str, Any]

    @property
    def size(self) -> int:
        return nbytes(self.model) + nbytes(self.optimizer)


class Ring:
    def __init__(self, every: int, keep: int) -> None:
        self.every = every
        self.ring: deque[Snapshot] = deque(maxlen=keep)

    def due(self, step: int) -> bool:
        return (step - 1) % self.every == 0

    def take(self, step: int, batches: int, model: Any, optimizer: Any, scheduler: Any) -> Snapshot:
        snap = Snapshot(step, batches, host_copy(model.state_dict()),
                        host_copy(optimizer.state_dict()) if optimizer is not None else None,
                        host_copy(scheduler.state_dict()) if scheduler is not None else None,
                        replay.capture_rng())
        self.ring.append(snap)
        return snap

    @staticmethod
    def restore(snap: Snapshot, model: Any, optimizer: Any, scheduler: Any) -> None:
        """In place (the parameters keep their identity: the optimizer and DDP hold them). The optimizer gets
        a fresh copy: on the same device `load_state_dict` keeps the tensors given, and Adam updates them in
        place, which would change the snapshot under the ring."""
        model.load_state_dict(snap.model)
        if optimizer is not None and snap.optimizer is not None:
            optimizer.load_state_dict(host_copy(snap.optimizer))
        if scheduler is not None and snap.scheduler is not None:
            scheduler.load_state_dict(host_copy(snap.scheduler))
        replay.restore_rng(snap.rng)
        for param in model.parameters():
            param.grad = None

    def local_report(self, model: Any) -> dict[str, Any]:
        """This rank's part of the exchange: are its live weights finite, and which snapshots are."""
        report: dict[str, Any] = {"weights_ok": True, "good": [], "error": None}
        try:
            report["weights_ok"] = all(bool(torch.isfinite(p).all()) for p in model.parameters()
                                       if p.is_floating_point())  # SYNC POINT: fault path only
            report["good"] = [s.step for s in self.ring if _finite(s.model)]
        except Exception as exc:  # carried to the other ranks, never raised: they wait in the exchange
            report["error"] = f"{type(exc).__name__}: {exc}"
        return report


@dataclass
class Verdict:
    """What every rank decided from the same gathered reports."""

    bad_ranks: list[int]  # ranks whose live weights are non-finite (empty: no rollback needed)
    target: int | None  # the snapshot step to restore; None with bad ranks: nothing to go back to


def decide(ring: Ring, model: Any, step: int) -> Verdict:
    """Every rank together (SYNC POINT: fault path only, every rank enters it on the same held step)."""
    reports = dist.gather_objects(ring.local_report(model))
    bad = [r for r, rep in enumerate(reports) if not rep["weights_ok"] or rep["error"]]
    if not bad:
        return Verdict([], None)
    common = set.intersection(*(set(rep["good"]) for rep in reports)) if reports else set()
    candidates = [s for s in common if s < step]
    return Verdict(bad, max(candidates) if candidates else None)


def find(ring: Ring, step: int) -> Snapshot:
    return next(s for s in ring.ring if s.step == step)


ACTION = ("rollback: the weights were non-finite after an applied step; every rank restored the snapshot "
          "named (weights, optimizer, scheduler, RNG), the batches since it skipped, not replayed")


def rollback(monitor: Any, ring: Ring, hold: Any, handed: int, model: Any, optimizer: Any,
             scheduler: Any) -> str:
    """On a held step, with snapshots on: "none" (weights finite: the gate's own path goes on), "rolled"
    (every rank restored the same snapshot; the step stays held), or "halt" (non-finite weights and no
    snapshot finite on every rank). The same answer on every rank."""
    verdict = decide(ring, model, hold.step)
    if not verdict.bad_ranks:
        return "none"
    if verdict.target is None:
        _write(monitor, {"type": "halt", "step": hold.step, "codes": [], "reason": "rollback-no-snapshot"},
               f"lossguard: halting at step {hold.step} on every rank: non-finite weights on rank(s) "
               f"{', '.join(map(str, verdict.bad_ranks))} and no snapshot finite on every rank to roll back to")
        return "halt"
    snap = find(ring, verdict.target)
    Ring.restore(snap, model, optimizer, scheduler)
    lost = hold.step - snap.step + 1  # the applied steps undone, and the held one
    event = {**monitor.gate.event(hold), "kind": "rollback", "ranks": verdict.bad_ranks, "steps_lost": lost,
             "signature": "nonfinite", "code": "LOSS001", "action": ACTION,
             "snapshot": {"step": snap.step, "batches": snap.batches, "bytes": snap.size},
             "batches_skipped": handed - snap.batches}
    _write(monitor, event,
           f"lossguard: recovered at step {hold.step}: non-finite weights on rank(s) "
           f"{', '.join(map(str, verdict.bad_ranks))} (LOSS001, nonfinite); every rank rolled back to the "
           f"snapshot of step {snap.step}: {lost} step(s) lost, {handed - snap.batches} batch(es) skipped; "
           f"{hold.used} of {monitor.gate.options.budget} recoveries within {monitor.gate.options.window} "
           f"steps used")
    return "rolled"


def _write(monitor: Any, line: dict[str, Any], text: str) -> None:
    if monitor.jsonl is not None:
        monitor.jsonl.write(line)
    if monitor.rank == 0 and monitor.options.console:
        from lossguard.monitor.sinks import say
        say(text)
