"""`Guard`: the live guard for a plain PyTorch or DDP loop.

    guard = lossguard.Guard(model, optimizer, events_dir="runs/lg", halt_on="error")
    for batch in loader:
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        guard.step(loss=loss, batch=batch)      # raises LossguardHalt on every rank together
        optimizer.zero_grad()

With gradient accumulation call `guard.observe(loss=..., batch=...)` for each micro-batch and
`guard.step()` once per optimizer step.
"""

from __future__ import annotations

from typing import Any

import torch

from lossguard.monitor import tensors
from lossguard.monitor.core import Monitor
from lossguard.monitor.options import GuardOptions


class LossguardHalt(RuntimeError):
    """Raised on every rank at the same optimizer step when a finding matches `halt_on`."""

    def __init__(self, step: int, halted_at: int | None = None, checkpoint_dir: str | None = None) -> None:
        self.step = step
        self.checkpoint_dir = checkpoint_dir
        where = f"; checkpoint saved under {checkpoint_dir}" if checkpoint_dir else ""
        super().__init__(f"lossguard halted the run at optimizer step {step}{where}")


class Guard:
    def __init__(self, model: torch.nn.Module, optimizer: Any = None, **options: Any) -> None:
        self.options = GuardOptions(**options)
        self.model = model
        self.optimizer = optimizer
        self.monitor = Monitor(self.options, model, optimizer=optimizer, facts=_torch_facts(), entry="guard")
        self.num_steps = 0

    def observe(self, *, loss: torch.Tensor | None = None, batch: Any = None, labels: Any = None) -> None:
        """One micro-batch: its loss (before any filtering) and its batch or labels."""
        if labels is None and batch is not None:
            labels = tensors.find_labels((batch,), {})
        self.monitor.observe_micro(loss=loss, labels=labels)

    def step(self, *, loss: torch.Tensor | None = None, batch: Any = None, labels: Any = None,
             model: Any = None, optimizer: Any = None, grad_norm: Any = None, step: int | None = None,
             skipped: bool = False) -> None:
        """End of one optimizer step (after `optimizer.step()`); raises `LossguardHalt` on a halt.

        `grad_norm`: pass what `clip_grad_norm_` returned; otherwise the norm of the gradients still
        present is computed. `skipped`: the step was not applied (e.g. GradScaler found inf).
        """
        if loss is not None or batch is not None or labels is not None:
            self.observe(loss=loss, batch=batch, labels=labels)
        self.num_steps += 1
        self._skipped = getattr(self, "_skipped", 0) + int(bool(skipped))
        optimizer = optimizer or self.optimizer
        model = model or self.model
        if grad_norm is None and not self.monitor.disabled:
            try:
                grad_norm = tensors.grad_norm(p for p in model.parameters() if p.requires_grad)
            except Exception:
                grad_norm = None
        lrs = [float(g["lr"]) for g in optimizer.param_groups] if optimizer is not None else None
        scaler_scale = None
        step_no = self.num_steps if step is None else step
        if self.monitor.end_step(step_no, grad_norm=grad_norm, lrs=lrs, loss_scale=scaler_scale,
                                 skipped_steps=self._skipped):
            raise LossguardHalt(step_no)

    def close(self) -> None:
        self.monitor.close()

    def __enter__(self) -> Guard:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _torch_facts() -> dict[str, Any]:
    return {"torch_version": torch.__version__, "entry_point": "guard"}
