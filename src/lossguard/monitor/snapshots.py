"""Snapshots and rollback (`RecoverOptions(snapshot_every=S)`, tier 3): undo a fault the gate cannot stop.

A fault seen only after the step was applied (weights that turned non-finite) cannot be held: the state
is already bad. With snapshots on, every rank keeps a ring (`keep`, default 2) of host copies of its OWN
state, taken when `Guard.commit` lets step n through and n - 1 is a multiple of S (so the first is the
initial state): the model's state_dict, the optimizer's (Adam moments, step counts, param groups and their
LRs), the LR schedulers' (given, or found: monitor/restorable.py), an fp16 GradScaler's scale, every RNG
(`replay.capture_rng`) and the data position (batches `Guard.batches` had handed out before step n). The step number decides, not communication: every
rank snapshots at the same step, with no collective. Cost on the host, per rank: a copy of the weights
and of the optimizer state, about 12 bytes per parameter for fp32 Adam (4 weights + 8 moments), times
`keep`, and a rollback's fresh copy of the optimizer state at its peak; whether that fits decides the
default (monitor/sizing.py).

The host buffers of a ring slot are allocated once and copied into (`fill`): a new snapshot reuses the
oldest slot's tensors where the layout is unchanged, so the normal path allocates nothing (allocating and
faulting in a fresh copy every S steps cost more than the copy). CUDA tensors go to pinned buffers with
`non_blocking` copies on a side stream; the snapshot's CUDA event marks it complete, and the host waits
for it only on the fault path (`local_report`, `restore`), never on the normal one.

When the gate holds a step and snapshots are on, every rank checks its own weights and its snapshots for
non-finite values and the ranks exchange that once (`gather_objects`, on the fault path only, entered by
every rank because the hold is decided from the gathered rows). Every rank reads the same list: when some
rank's weights are non-finite, every rank restores the newest snapshot whose weights are finite on every
rank, drops its gradients, and the loop goes on from the next batch (the batches since the snapshot are
skipped, not replayed: the data position moves on). No such snapshot: halt.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from lossguard.monitor import dist, dtensor, replay, restorable
from lossguard.monitor.recover import DRIFT


def host_copy(value: Any) -> Any:
    """A detached host copy of a (nested) state dict: tensors cloned to the CPU, the rest copied."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: host_copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(host_copy(v) for v in value)
    return value


class _Copier:
    """Copies tensors into host buffers for one `take`. CUDA tensors (of the first CUDA device met) are copied
    with `non_blocking` on `stream`, a side stream, so the host goes on while the copy runs; others copy
    synchronously (`copy_`)."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream  # the ring's side stream, None until a CUDA tensor is met
        self.queued = False

    def buffer(self, tensor: torch.Tensor) -> torch.Tensor:
        # pinned for CUDA sources: a non_blocking copy into pageable memory would be synchronous
        return torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=tensor.is_cuda)

    def copy(self, buffer: torch.Tensor, tensor: torch.Tensor) -> None:
        if not tensor.is_cuda:
            buffer.copy_(tensor)
            return
        if self.stream is None:
            self.stream = torch.cuda.Stream(tensor.device)
        if tensor.device != self.stream.device:  # a second CUDA device: rare, copied synchronously
            buffer.copy_(tensor)
            return
        if not self.queued:  # the side stream reads the state only after the work that produced it
            self.stream.wait_stream(torch.cuda.current_stream(tensor.device))
            self.queued = True
        with torch.cuda.stream(self.stream):
            buffer.copy_(tensor, non_blocking=True)

    def finish(self) -> Any:
        """The event that marks the queued copies done (None: nothing queued). The compute stream waits for
        it on the device (no host sync): the step after the snapshot updates the copied tensors in place."""
        if not self.queued:
            return None
        event = torch.cuda.Event()
        event.record(self.stream)
        torch.cuda.current_stream(self.stream.device).wait_event(event)
        return event


def _fits(buffer: Any, tensor: torch.Tensor) -> bool:
    return isinstance(buffer, torch.Tensor) and buffer.shape == tensor.shape and buffer.dtype == tensor.dtype


def fill(old: Any, value: Any, copier: _Copier) -> Any:
    """A host copy of the (nested) state `value`, like `host_copy`, written into the tensors of `old` (the
    same slot's previous copy) wherever one sits at the same key with the same shape and dtype; fresh
    buffers elsewhere (the first snapshot, or a changed layout: Adam allocates its moments at its first
    step). Non-tensors are carried as `host_copy` carries them."""
    if isinstance(value, torch.Tensor):
        value = value.detach()
        if value.layout != torch.strided:  # sparse and the like: no buffer to reuse, copied as before
            return value.to("cpu", copy=True)
        buffer = old if _fits(old, value) else copier.buffer(value)
        copier.copy(buffer, value)
        return buffer
    if isinstance(value, dict):
        old = old if isinstance(old, dict) else {}
        return {k: fill(old.get(k), v, copier) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        olds = old if isinstance(old, (list, tuple)) and len(old) == len(value) else [None] * len(value)
        return type(value)(fill(o, v, copier) for o, v in zip(olds, value))
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


class Trainable:
    """What `Guard`'s snapshot holds of a model: its trained parameters and its buffers (running statistics).
    Frozen weights never change, so the snapshot of a LoRA fine-tune holds the adapters, not the base model.
    The ring reads and restores it as it would a model. An FSDP2 parameter (a DTensor) is held as this rank's
    local shard (`to_local()`, no collective) and restored by copying into that shard in place."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def _live(self) -> dict[str, torch.Tensor]:
        state = {n: p for n, p in self.model.named_parameters() if p.requires_grad}
        state.update(self.model.named_buffers())
        return state

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {n: dtensor.local(t.detach()) if dtensor.is_dtensor(t) else t for n, t in self._live().items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        live = self._live()
        if not any(dtensor.is_dtensor(t) for t in live.values()):
            self.model.load_state_dict(state, strict=False)  # copied in place: the parameters keep their identity
            return
        with torch.no_grad():  # FSDP2: each rank writes its own shards, no collective
            for name, tensor in live.items():
                if name in state:
                    dtensor.local(tensor.detach()).copy_(state[name])

    def parameters(self) -> list[torch.Tensor]:
        return [t for t in self.state_dict().values() if t.is_floating_point()]

    def replicated(self) -> list[str]:
        """Every key but FSDP2's shards: under data parallelism each replica holds the whole model."""
        return [n for n, t in self._live().items() if not dtensor.is_dtensor(t)]


@dataclass
class Snapshot:
    step: int  # taken as step `step` was let through: the state after `step - 1` steps
    batches: int  # batches handed out before this step's batch
    model: dict[str, Any]
    optimizer: dict[str, Any] | None
    scheduler: dict[str, Any] | None
    rng: dict[str, Any]
    event: Any = field(default=None, repr=False)  # CUDA: fires once its copies are done; None: no copy queued
    scaler: dict[str, Any] | None = None  # an fp16 GradScaler's scale and growth tracker (restorable.py)

    @property
    def size(self) -> int:
        return nbytes(self.model) + nbytes(self.optimizer)

    @property
    def complete(self) -> bool:
        """Its copies are done (no wait): a CUDA snapshot's buffers are still being written until then."""
        return self.event is None or bool(self.event.query())

    def wait(self) -> None:
        """Until its copies are done (SYNC POINT on CUDA: called on the fault path only)."""
        if self.event is not None:
            self.event.synchronize()


class Ring:
    def __init__(self, every: int, keep: int) -> None:
        self.every = every
        self.ring: deque[Snapshot] = deque(maxlen=keep)
        self.stream: Any = None  # the side stream of CUDA copies, made at the first CUDA tensor

    def due(self, step: int) -> bool:
        return (step - 1) % self.every == 0

    def take(self, step: int, batches: int, model: Any, optimizer: Any, scheduler: Any,
             scaler: Any = None) -> Snapshot:
        """A snapshot into the oldest slot's buffers once the ring is full. The slot leaves the ring before
        it is overwritten: when the copy fails half way, the ring holds one snapshot less, never a torn one."""
        old = self.ring.popleft() if len(self.ring) == self.ring.maxlen else None
        copier = _Copier(self.stream)
        try:
            state = (fill(old.model if old else None, model.state_dict(), copier),
                     fill(old.optimizer if old else None, optimizer.state_dict(), copier)
                     if optimizer is not None else None,
                     host_copy(scheduler.state_dict()) if scheduler is not None else None,
                     fill(old.scaler if old else None, scaler.state_dict(), copier) if scaler is not None else None)
        finally:  # whatever was queued, the compute stream must not update its sources before it is read
            event = copier.finish()
            self.stream = copier.stream
        snap = Snapshot(step, batches, *state[:3], replay.capture_rng(), event, state[3])
        self.ring.append(snap)
        return snap

    @staticmethod
    def restore(snap: Snapshot, model: Any, optimizer: Any, scheduler: Any, scaler: Any = None) -> None:
        """In place (the parameters keep their identity: the optimizer and DDP hold them). A torch optimizer
        gets a fresh copy: on the same device `load_state_dict` keeps the tensors given, and Adam updates
        them in place, which would change the snapshot under the ring (whose buffers the next snapshot into
        this slot overwrites, too); that copy is a rollback's peak host memory (sizing.restore_bytes). One
        that copies back in place (`copies_in_place`: DeepSpeed's) reads the snapshot as it is."""
        snap.wait()
        model.load_state_dict(snap.model)
        if optimizer is not None and snap.optimizer is not None:
            in_place = getattr(optimizer, "copies_in_place", False)
            optimizer.load_state_dict(snap.optimizer if in_place else host_copy(snap.optimizer))
        if scheduler is not None and snap.scheduler is not None:
            scheduler.load_state_dict(host_copy(snap.scheduler))
        if scaler is not None and snap.scaler is not None:
            scaler.load_state_dict(snap.scaler)
        replay.restore_rng(snap.rng)
        for param in model.parameters():
            param.grad = None

    def local_report(self, model: Any, drift: bool = False) -> dict[str, Any]:
        """This rank's part of the exchange: are its live weights finite, which snapshots are, and (`drift`)
        each snapshot's fingerprint of the weights every replica should hold alike."""
        report: dict[str, Any] = {"weights_ok": True, "good": [], "prints": {}, "error": None}
        try:
            report["weights_ok"] = all(bool(torch.isfinite(p).all()) for p in model.parameters()
                                       if p.is_floating_point())  # SYNC POINT: fault path only
            for snap in self.ring:
                snap.wait()  # SYNC POINT on CUDA, fault path only: its buffers are read next
            report["good"] = [s.step for s in self.ring if _finite(s.model)]
            if drift:
                keys = model.replicated() if hasattr(model, "replicated") else sorted(self.ring[0].model)
                report["prints"] = {s.step: _print(s.model, keys) for s in self.ring}
        except Exception as exc:  # carried to the other ranks, never raised: they wait in the exchange
            report["error"] = f"{type(exc).__name__}: {exc}"
        return report


@dataclass
class Verdict:
    """What every rank decided from the same gathered reports."""

    bad_ranks: list[int]  # ranks whose live weights are non-finite (empty: no rollback needed)
    target: int | None  # the snapshot step to restore; None with bad ranks: nothing to go back to


def _print(state: dict[str, Any], keys: list[str]) -> float:
    """A fingerprint of a snapshot's replicated weights: the same float on every replica that holds the same
    bits (the same sums in the same order)."""
    return sum((i + 1) * float(state[k].double().sum()) for i, k in enumerate(keys)
               if isinstance(state.get(k), torch.Tensor) and state[k].is_floating_point())


def decide(ring: Ring, model: Any, step: int, drift: bool = False) -> Verdict:
    """Every rank together (SYNC POINT: fault path only, every rank enters it on the same held step). A good
    snapshot is finite on every rank and, after a drift, fingerprinted alike on every rank."""
    reports = dist.gather_objects(ring.local_report(model, drift))
    bad = [r for r, rep in enumerate(reports) if not rep["weights_ok"] or rep["error"]]
    common = set.intersection(*(set(rep["good"]) for rep in reports)) if reports else set()
    if drift:
        common = {s for s in common if len({rep["prints"].get(s) for rep in reports}) == 1}
    candidates = [s for s in common if s < step]
    return Verdict(bad, max(candidates) if candidates else None)


def find(ring: Ring, step: int) -> Snapshot:
    return next(s for s in ring.ring if s.step == step)


ACTION = ("rollback: the weights were non-finite after an applied step; every rank restored the snapshot "
          "named ({restored}), the batches since it skipped, not replayed")


JUMP_ACTION = ("rollback: the loss jumped far above the run's spread and jumped again when the batch was "
               "replayed, with finite weights: the state, not the batch; every rank restored the snapshot named "
               "({restored}), the batches since it skipped, not replayed")


DRIFT_ACTION = ("rollback: the replicas' weights differed (one rank's copy drifted from the others'); every "
                "rank restored the newest snapshot fingerprinted alike on every rank ({restored}), the batches "
                "since it skipped")


def restored(snap: Snapshot, scheduler: Any, scaler: Any = None) -> list[str]:
    """What restoring `snap` gives back, as the event names it: no scheduler named when none was held."""
    return ["weights"] + (["optimizer state and its LRs"] if snap.optimizer is not None else []) + \
        ([f"LR scheduler {restorable.name(scheduler)}"] if scheduler is not None and snap.scheduler is not None
         else []) + (["loss scale"] if scaler is not None and snap.scaler is not None else []) + ["RNG"]


def rollback(monitor: Any, ring: Ring, hold: Any, handed: int, model: Any, optimizer: Any,
             scheduler: Any, jump: bool = False, scaler: Any = None) -> str:
    """On a held step, with snapshots on: "none" (weights finite: the gate's own path goes on), "rolled"
    (every rank restored the same snapshot; the step stays held), or "halt" (non-finite weights and no
    snapshot finite on every rank). `jump` (a loss jump that came back on replay) and a held drift roll
    back with finite weights too ("none" when no snapshot is there to go back to). The same on every rank."""
    drift = any(f["fault"] == DRIFT for f in hold.faults)
    verdict = decide(ring, model, hold.step, drift)
    if not verdict.bad_ranks and not ((jump or drift) and verdict.target is not None):
        return "none"
    if verdict.target is None:
        _write(monitor, {"type": "halt", "step": hold.step, "codes": [], "reason": "rollback-no-snapshot"},
               f"lossguard: halting at step {hold.step} on every rank: non-finite weights on rank(s) "
               f"{', '.join(map(str, verdict.bad_ranks))} and no snapshot finite on every rank to roll back to")
        return "halt"
    snap = find(ring, verdict.target)
    error = None
    try:
        Ring.restore(snap, model, optimizer, scheduler, scaler)
    except Exception as exc:  # one rank's (out of memory): agreed on below, never raised into the loop
        error = f"{type(exc).__name__}: {exc}"
    failed = {r: e for r, e in enumerate(dist.gather_objects(error)) if e}  # SYNC POINT: rollback path only
    if failed:  # the ranks' states may now differ (some restored, some half): nothing to train on, halt
        _write(monitor, {"type": "halt", "step": hold.step, "codes": [], "reason": "rollback-failed",
                         "errors": failed},
               f"lossguard: halting at step {hold.step} on every rank: restoring the snapshot of step {snap.step} "
               f"failed on rank(s) {', '.join(map(str, failed))} ({next(iter(failed.values()))}); the ranks' "
               "states can no longer be trusted to match")
        return "halt"
    lost = steps_lost(hold.step, snap.step, monitor.gate.recent)  # the applied steps undone, and the held one
    cause = ("non-finite weights", "nonfinite", "LOSS001", ACTION, verdict.bad_ranks) if verdict.bad_ranks else \
        (DRIFT, "rank-desync", "RANK001", DRIFT_ACTION, hold.ranks) if drift else \
        ("a loss jump that came back on replay", "loss-spike", "LOSS006", JUMP_ACTION, hold.ranks)
    what = restored(snap, scheduler, scaler)
    event = {**monitor.gate.event(hold), "kind": "rollback", "ranks": cause[4], "steps_lost": lost,
             "signature": cause[1], "code": cause[2], "action": cause[3].format(restored=", ".join(what)),
             "restored": what,
             "snapshot": {"step": snap.step, "batches": snap.batches, "bytes": snap.size},
             "batches_skipped": handed - snap.batches}
    monitor.gate.note(event)
    _write(monitor, event,
           f"lossguard: recovered at step {hold.step}: {cause[0]} on rank(s) "
           f"{', '.join(map(str, cause[4]))} ({cause[2]}, {cause[1]}); every rank rolled back to the "
           f"snapshot of step {snap.step}: {lost} step(s) lost, {handed - snap.batches} batch(es) skipped; "
           f"{hold.used} of {monitor.gate.options.budget} recoveries within {monitor.gate.options.window} "
           f"steps used")
    return "rolled"


def steps_lost(step: int, snapshot_step: int, recent: dict[int, dict[str, Any]]) -> int:
    """The steps a rollback at `step` to the snapshot of `snapshot_step` loses: those since the snapshot and
    the held one, less those already counted: by an earlier rollback to that snapshot (or one before it),
    or as a held step of their own."""
    before = max((s for s, e in recent.items() if e.get("kind") == "rollback" and s < step), default=None)
    first = snapshot_step if before is None else max(snapshot_step, before + 1)
    held = sum(1 for s, e in recent.items() if first <= s < step and e.get("kind") != "rollback"
               and (e.get("steps_lost") or 0) >= 1)
    return step - first + 1 - held


def _write(monitor: Any, line: dict[str, Any], text: str) -> None:
    if monitor.jsonl is not None:
        monitor.jsonl.write(line)
    if monitor.rank == 0 and monitor.options.console:
        from lossguard.monitor.sinks import say
        say(text)
