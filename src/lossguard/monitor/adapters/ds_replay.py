"""Replay under a DeepSpeed engine (`attach(engine, recover=True)`): the held step's batch, run again.

The loop stays as it was (`loss = engine(**batch).loss; engine.backward(loss); engine.step()`). `Capture`
records each training forward's keyword arguments (the batch as the model got it) and the RNG state as it
starts. When the gate holds the step, the replay (monitor/replay.py) calls the engine again with them and
reads the loss from the model's output; its gradients go through the engine's own `backward`, so ZeRO
reduces them as in the first attempt. `DeepSpeedOps` drops gradients by DeepSpeed's overflow path
(ds_hold.py) with the engine's counters put back, since the replay's step is the one that counts.

Replayed only when the step had one micro-batch (gradient accumulation 1: replaying an accumulated step
would need every micro-batch), the model was called with keyword tensors only, and its output carries the
loss (a loss computed outside the model cannot be recomputed here). Otherwise the step is held, as tier 1.
Under ZeRO-3 every forward all-gathers parameters: the per-sample scan then runs the same number of
forwards on every rank (`symmetric_scan`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from lossguard.monitor import quarantine, replay, tensors
from lossguard.monitor.adapters import ds_hold, ds_norm
from lossguard.monitor.adapters.instance import shadow
from lossguard.monitor.quarantine import Quarantine


class Capture:
    """The last training forward's batch and RNG state (one micro-batch per step); a forward pre-hook. It
    also leaves out of each training forward the samples a recovery quarantined (`held`): under the Trainer,
    whose data loader the guard does not hand out, that is where the quarantine is honoured."""

    def __init__(self, held: Quarantine | None = None) -> None:
        self.held = held
        self.shed = quarantine.Shedder(held) if held is not None else None
        self.batch: dict[str, Any] | None = None
        self.rng: dict[str, Any] | None = None
        self.forwards = 0  # training forwards since the last step
        self.off = False  # the replay's own forwards are not captured
        self.emptied = False  # a training forward's batch held only quarantined samples

    def record(self, module: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        if self.off or not module.training:
            return None
        changed = None
        if self.held is not None and not args and kwargs:
            kept, emptied = self.shed(kwargs)
            self.emptied = self.emptied or emptied  # every rank skips the step (EngineGate)
            if kept is not kwargs:
                kwargs = changed = dict(kept)
        self.forwards += 1
        self.batch = dict(kwargs) if not args and kwargs else None
        self.rng = replay.capture_rng()
        return (args, changed) if changed is not None else None

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The replay's own forwards (and the scan's): neither captured nor measured as the step's."""
        self.off = True
        try:
            yield
        finally:
            self.off = False

    def ready(self) -> bool:
        return self.forwards == 1 and self.batch is not None

    def reset(self) -> None:
        self.batch, self.rng, self.forwards, self.emptied = None, None, 0, False


@dataclass
class Source:
    """Where a replay under DeepSpeed gets its batch and how it recomputes it."""

    capture: Capture  # its `held`: the quarantine the replay's `sample` verdict adds to
    forward: Callable[[dict[str, Any]], torch.Tensor]  # a batch -> its loss
    backward: Callable[[torch.Tensor], Any]  # that loss -> the gradients
    scan: Callable[[dict[str, Any]], torch.Tensor]  # one sample -> its loss, under no_grad


def raw_source(engine: Any, capture: Capture, backward: Callable[[Any], Any]) -> Source:
    """`attach`: the engine called again as the loop called it; its own `backward`."""
    forward = forward_of(engine, capture)
    return Source(capture, forward, backward, forward)


def trainer_source(trainer: Any, capture: Capture, replaying: Callable[[bool], None]) -> Source:
    """The Trainer under DeepSpeed: the Trainer's own `training_step` on the captured inputs, which repeats
    every transformation between the model's loss and `backward` (its `num_items_in_batch` scaling, the
    gradient-accumulation division); `replaying(True)` makes the engine's `step()` that the backward ends
    with a no-op (the gate decides the step). The Trainer's `accelerator.backward` call is held back while
    `training_step` runs and made by `backward`: the replay agrees across the ranks between the two, so
    that a rank whose forward raised and the others run the backward's collectives together, or none
    does. The scan calls the model directly."""
    pending: list[tuple[torch.Tensor, dict[str, Any]]] = []

    def forward(batch: dict[str, Any]) -> torch.Tensor:
        inputs = {k: v for k, v in batch.items() if k != "num_items_in_batch"}
        pending.clear()
        replaying(True)
        undo = shadow(trainer.accelerator, "backward", lambda loss, **kwargs: pending.append((loss, kwargs)))
        try:
            with capture.paused():
                return trainer.training_step(trainer.model_wrapped, inputs, batch.get("num_items_in_batch"))
        finally:
            undo()
            replaying(False)

    def backward(_: torch.Tensor) -> None:
        if not pending:
            return
        loss, kwargs = pending.pop()
        replaying(True)
        try:
            trainer.accelerator.backward(loss, **kwargs)
        finally:
            replaying(False)

    def scan(batch: dict[str, Any]) -> torch.Tensor:
        with capture.paused():
            return tensors.output_loss(trainer.model(**batch))

    return Source(capture, forward, backward, scan)


class DeepSpeedOps(replay.Ops):
    def __init__(self, engine: Any, run_step: Callable[[], Any], source: Source) -> None:
        super().__init__(engine.module)
        self.engine = engine
        self.run_step = run_step
        self._backward = source.backward
        self.scan = source.scan
        self.symmetric_scan = _zero_stage(engine) == 3

    def drop(self) -> None:
        ds_hold.hold(self.engine, self.run_step, counted=False)

    def backward(self, loss: torch.Tensor) -> None:
        self._backward(loss)

    def grads_ok(self) -> bool:
        # Reduced into ZeRO partitions and read inside the step: DeepSpeed's own overflow check skips a
        # step whose gradients are non-finite (and the guard reports the skip). The loss decides here.
        return True

    def norm(self) -> float | None:
        """The replay's gradient norm as the gate measured the first attempt's (ds_norm.py), so that a held
        jump whose replayed update is ordinary is committed; None when not found or non-finite (DeepSpeed's
        own overflow check has those). SYNC POINT: fault path only."""
        norm = ds_norm.pre_step_norm(self.engine)
        value = None if norm is None else float(norm)
        return value if value is not None and math.isfinite(value) else None


def forward_of(engine: Any, capture: Capture) -> Callable[[dict[str, Any]], torch.Tensor]:
    """The replay's forward: the engine called as the loop called it, its output's loss."""
    def forward(batch: dict[str, Any]) -> torch.Tensor:
        with capture.paused():
            loss = tensors.output_loss(engine(**batch), detach=False)
        if loss is None:
            raise ValueError("the model's output carries no loss: the step cannot be replayed")
        return loss

    return forward


def _zero_stage(engine: Any) -> int:
    try:
        return int(engine.zero_optimization_stage())
    except Exception:
        return 0
