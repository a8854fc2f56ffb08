"""`LossguardLightningCallback`: the live guard inside a Lightning `Trainer` (the `lightning` package).

A `Guard` driven by three hooks, in the order Lightning 2.x calls them for one optimizer step:

- `on_before_optimizer_step`: after `backward` (and the AMP unscale, and DDP's gradient all-reduce), before
  Lightning clips in `configure_gradient_clipping`: the unclipped gradient norm and the learning rates this
  step uses (the step-interval schedulers move them before `on_train_batch_end`).
- `on_train_batch_end`: each batch's loss from `outputs` (Lightning divided it by `accumulate_grad_batches`
  for backward; multiplied back here) and its labels; when `trainer.global_step` moved, the step ends
  (`Guard.step`), which is where every rank exchanges its signals and takes the same halt decision.
- a halt sets `trainer.should_stop` on every rank at that step (also when `min_steps` / `min_epochs` would
  keep the run going), and with `halt_checkpoint_dir` every rank calls `trainer.save_checkpoint` there
  (collective: rank 0 writes, all wait).

The grad norm is that of the gradients in `.grad` (DDP, single device); under FSDP (FSDP1 or FSDP2) the
run's norm, which the guard folds from every rank's shard in its per-step exchange. With `16-mixed` the precision plugin's GradScaler is the guard's `scaler`:
its overflows (a non-finite norm beside a finite loss: Lightning's `scaler.step` skips the step) are never
findings, held steps or budget.

`recover=True` (lightning_gate.py): the step ends in `on_before_optimizer_step` instead, through
`Guard.commit`, with each micro-batch's loss read in `on_before_backward`; a held step's gradients are set
to None (the optimizer then updates nothing and counts no step) and the step-interval LR schedulers do not
step; Lightning still counts the step (`global_step`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch
from lightning.pytorch import Callback

from lossguard.monitor import tensors
from lossguard.monitor.adapters import lightning_gate
from lossguard.monitor.guard import Guard, LossguardHalt, exit_after_halt
from lossguard.monitor.options import GuardOptions


class LossguardLightningCallback(Callback):
    def __init__(self, *, halt_checkpoint_dir: str | os.PathLike | None = None, **options: Any) -> None:
        self.options = GuardOptions(**options)
        self.gate = lightning_gate.Gate(self) if self.options.recovery is not None else None
        self.halt_checkpoint_dir = None if halt_checkpoint_dir is None else os.fspath(halt_checkpoint_dir)
        self.guard: Guard | None = None
        self.checkpoint_path: str | None = None  # written at the halt
        self._last_step = 0
        self._grad_norm: Any = None
        self._lrs: list[float] | None = None

    @property
    def halted_at(self) -> int | None:
        return self.guard.monitor.halted_at if self.guard is not None else None

    # -- Lightning hooks -------------------------------------------------------------------------
    def on_train_start(self, trainer, pl_module) -> None:
        optimizer = trainer.optimizers[0] if trainer.optimizers else None
        self.guard = Guard.for_entry(pl_module, optimizer, self.options, facts=_lightning_facts(trainer),
                                     entry="lightning")
        self._last_step = trainer.global_step
        # 16-mixed: the precision plugin's GradScaler; its start-up overflows are its own (Guard's `scaler`)
        self.guard.scaler = getattr(getattr(trainer, "precision_plugin", None), "scaler", None)
        if self.gate is not None:
            self.gate.start(trainer)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.gate is not None:
            self.gate.batch = batch

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        if self.gate is not None and self.guard is not None:
            self.gate.observe(trainer, pl_module, loss)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if self.guard is None or self.guard.monitor.disabled:
            return
        try:  # device ops, no host sync; never raised into the user's loop
            # under FSDP the monitor folds the run's norm from every rank's shard (monitor/sharding.py)
            self._grad_norm = None if self.guard.monitor.sharded else \
                tensors.grad_norm(p for p in pl_module.parameters() if p.requires_grad)
            self._lrs = [float(g["lr"]) for g in optimizer.param_groups]
        except Exception:
            self._grad_norm, self._lrs = None, None
        if self.gate is not None:
            grad_norm, lrs, self._grad_norm, self._lrs = self._grad_norm, self._lrs, None, None
            self.gate.commit(trainer, optimizer, grad_norm, lrs)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.guard is None:
            return
        if self.gate is not None:  # the step ended at the gate, before it was applied
            self._last_step = trainer.global_step
            halted = self.gate.end()
            if halted is not None:
                self._halt(trainer, halted)
            return
        self.guard.observe(loss=_batch_loss(outputs, trainer, pl_module), batch=batch)
        step = trainer.global_step
        if step == self._last_step:  # accumulating: no optimizer step in this batch
            return
        self._last_step = step
        grad_norm, lrs, self._grad_norm, self._lrs = self._grad_norm, self._lrs, None, None
        try:
            self.guard.step(step=step, grad_norm=grad_norm, lrs=lrs,
                            optimizer=trainer.optimizers[0] if trainer.optimizers else None)
        except LossguardHalt:
            self._halt(trainer, step)

    def on_train_end(self, trainer, pl_module) -> None:
        if self.guard is not None:
            self.guard.monitor.close()

    def on_exception(self, trainer, pl_module, exception) -> None:
        if self.guard is not None:
            self.guard.monitor.close()

    def teardown(self, trainer, pl_module, stage: str) -> None:
        # The last hook of `fit`, on every rank: the halt's checkpoint is written and the loop has returned.
        if stage == "fit" and self.guard is not None:
            exit_after_halt(self.guard.monitor)

    # -- the halt --------------------------------------------------------------------------------
    def _halt(self, trainer, step: int) -> None:
        """Every rank is here at the same step (the guard's exchange decided it from the same rows)."""
        trainer.should_stop = True
        # `should_stop` waits for `min_steps` / `min_epochs`; a halted run must not train on to reach them
        trainer.fit_loop.min_epochs = 0
        trainer.fit_loop.epoch_loop.min_steps = None
        if self.halt_checkpoint_dir is not None:
            self.checkpoint_path = os.path.join(self.halt_checkpoint_dir, f"lossguard-halt-step{step}.ckpt")
            trainer.save_checkpoint(self.checkpoint_path)


def _batch_loss(outputs: Any, trainer, pl_module) -> torch.Tensor | None:
    """The batch's loss as `training_step` returned it (before Lightning's division for accumulation)."""
    loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
    if not isinstance(loss, torch.Tensor):
        return None
    accumulate = trainer.accumulate_grad_batches
    if pl_module.automatic_optimization and accumulate > 1:
        loss = loss.detach() * accumulate
    return loss


def _lightning_facts(trainer) -> dict[str, Any]:
    import lightning

    precision = str(trainer.precision)
    return {"lightning_version": lightning.__version__, "entry_point": "lightning",
            "gradient_accumulation_steps": trainer.accumulate_grad_batches,
            "bf16": precision.startswith("bf16"), "fp16": precision.startswith("16"),
            "strategy": type(trainer.strategy).__name__, "gradient_clip_val": trainer.gradient_clip_val}
