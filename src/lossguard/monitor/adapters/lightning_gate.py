"""`LossguardLightningCallback(recover=True)`: the commit gate inside a Lightning `Trainer`.

Lightning runs the optimizer step as `optimizer.step(closure)`: the closure runs `training_step`, calls
`on_before_backward` (where each micro-batch's loss is read, multiplied back from Lightning's division for
accumulation) and `backward`, then `on_before_optimizer_step`, and the optimizer updates the parameters that
have a gradient. The gate decides there, through `Guard.commit` (the step's exchange, before the update):

- committed: nothing changes;
- held: `Guard.commit` set every gradient to None, so the optimizer updates nothing and counts no step
  (torch's optimizers skip a parameter without a gradient; gradient clipping skips it too), and the
  step-interval LR schedulers' `step` is a no-op on their instances until `on_train_batch_end` (Lightning
  steps them in between). Lightning still counts the step (`global_step`); the recovery is recorded under it;
- a halt (the budget spent) holds the step too; the callback stops the run at `on_train_batch_end`, outside
  the optimizer's closure, where it may save a checkpoint.

No replay (the closure is Lightning's: a replay would run `training_step` a second time inside it). A snapshot
holds every LR scheduler of `lr_scheduler_configs`, step- and epoch-interval alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from lossguard.monitor import restorable
from lossguard.monitor.adapters.instance import noop_step
from lossguard.monitor.guard import LossguardHalt


class Gate:
    def __init__(self, callback: Any) -> None:
        self.callback = callback
        self.batch: Any = None  # the micro-batch being trained on (its labels)
        self._undo: list[Callable[[], None]] = []
        self._halt_at: int | None = None
        self._schedulers: list[Any] = []

    def start(self, trainer: Any) -> None:
        configs = getattr(trainer, "lr_scheduler_configs", None) or []
        self._schedulers = [c.scheduler for c in configs if getattr(c, "interval", "epoch") == "step"]
        every = [c.scheduler for c in configs if getattr(c, "scheduler", None) is not None]
        if every:
            self.callback.guard.scheduler = restorable.bundle(every)

    def observe(self, trainer: Any, pl_module: Any, loss: torch.Tensor) -> None:
        accumulate = trainer.accumulate_grad_batches
        if pl_module.automatic_optimization and accumulate > 1:
            loss = loss.detach() * accumulate
        self.callback.guard.observe(loss=loss, batch=self.batch)

    def commit(self, trainer: Any, optimizer: Any, grad_norm: Any, lrs: list[float] | None) -> None:
        guard = self.callback.guard
        step = trainer.global_step + 1  # the number Lightning gives this step once it is taken
        try:
            ok = guard.commit(step=step, grad_norm=grad_norm, lrs=lrs, optimizer=optimizer)
        except LossguardHalt:
            for param in guard.model.parameters():
                param.grad = None  # the halt holds the step too
            self._halt_at, ok = step, False
        if not ok:
            self._undo = [noop_step(s) for s in self._schedulers]

    def end(self) -> int | None:
        """At the batch's end: put back what a held step shadowed; the step to halt at, if any."""
        for undo in self._undo:
            undo()
        self._undo = []
        halt, self._halt_at = self._halt_at, None
        return halt
