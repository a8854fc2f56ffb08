"""`LossguardCallback(recover=True)`: the commit gate inside `transformers.Trainer`.

Under DeepSpeed the Trainer's `accelerator.backward` calls `engine.step()` right after `engine.backward()`:
the engine instance's `step` is wrapped for the run and `EngineGate` decides there (adapters/deepspeed.py).
A held step takes DeepSpeed's own overflow path (adapters/ds_hold.py): weights, fp32 master, optimizer
state, the LR scheduler the engine steps and the loss scale stay as they were. With one micro-batch a step
it is then replayed through the Trainer's own `training_step` on the captured inputs (`transient` /
`sample`, monitor/replay.py, ds_replay.trainer_source); quarantined samples are left out of later training
forwards by the capturing pre-hook.

Otherwise (DDP, one process) the gate decides in `on_pre_optimizer_step`, the last callback before the
Trainer's `optimizer.step()`, from the step's exchange, with the norm the Trainer has just computed. For a
held step the optimizer's and the LR scheduler's `step` are shadowed by no-ops on their instances for that
one step (put back in `on_step_end`), and the Trainer's own `model.zero_grad()` drops the gradients. fp16
with a GradScaler is refused: a skipped `scaler.step` would leave the scaler expecting its `update`.

Either way the Trainer still counts the step (`state.global_step` moves on); the recovery is recorded under
that number. A halt (the budget spent; under DeepSpeed also a finding on the step before, which the gate
reads with this step's exchange) holds the step too, then `on_step_end` asks the Trainer to save a
checkpoint and stop, as a halt without recovery does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lossguard.monitor import quarantine, sizing, tensors
from lossguard.monitor.adapters import ds_replay
from lossguard.monitor.adapters.deepspeed import EngineGate
from lossguard.monitor.adapters.instance import noop_step
from lossguard.monitor.options import OptionError


class TrainerGate:
    """The gate of a Trainer without DeepSpeed."""

    def __init__(self, callback: Any) -> None:
        self.callback = callback
        self.halt = False
        self._undo: list[Callable[[], None]] = []
        callback.monitor.lag = 1  # fingerprints and update ratios are read before the step
        callback.monitor.planner = sizing.Planner(  # said in the start line: no snapshots here yet
            callback.monitor, None, lambda every: "",
            "the Trainer without DeepSpeed holds faulty steps, it does not roll back (snapshots and rollback: "
            "the Trainer under DeepSpeed, attach, Guard)")

    def before_step(self, state: Any, optimizer: Any, scheduler: Any) -> None:
        monitor = self.callback.monitor
        lrs = [float(g["lr"]) for g in optimizer.param_groups] if optimizer is not None else None
        halt = monitor.end_step(state.global_step + 1, grad_norm=self.callback._grad_norm, lrs=lrs, gating=True)
        if halt or monitor.held is not None:
            self._undo = [noop_step(owner) for owner in (optimizer, scheduler) if owner is not None]
        self.halt = self.halt or halt

    def after_step(self) -> None:
        for undo in self._undo:
            undo()
        self._undo = []


class DeepSpeedGate:
    """The gate of a Trainer under DeepSpeed: the engine's `step`, wrapped on the instance for the run. With
    the Trainer at hand and one micro-batch a step, a held step is replayed through the Trainer's own
    `training_step` (ds_replay.trainer_source); a forward pre-hook on the model captures each batch and
    leaves out the samples a recovery quarantined."""

    def __init__(self, callback: Any, engine: Any, state: Any, trainer: Any) -> None:
        self.engine = engine
        self.halt = False
        self.replaying = False  # the replay's own `engine.step()`, inside `training_step`: a no-op
        self.capture: ds_replay.Capture | None = None
        self._hook = None
        source = None
        if trainer is not None and callback.options.recovery.replay:
            self.capture = ds_replay.Capture(quarantine.Quarantine(callback.options.events_dir))
            self._hook = tensors.unwrap_model(engine.module).register_forward_pre_hook(
                self.capture.record, with_kwargs=True)
            source = ds_replay.trainer_source(trainer, self.capture, self._set_replaying)
        # the LR scheduler a snapshot holds: the engine's, else the Trainer's own (stepped by the Trainer)
        scheduler = lambda: engine.lr_scheduler or getattr(trainer, "lr_scheduler", None)  # noqa: E731
        self.gate = EngineGate(engine, callback.monitor, lambda: state.global_step + 1, source, scheduler)
        self._original = engine.step
        engine.step = self._step

    def _set_replaying(self, on: bool) -> None:
        self.replaying = on

    def _step(self, *args: Any, **kwargs: Any) -> Any:
        if self.replaying:
            return None
        if not self.engine.is_gradient_accumulation_boundary():
            return self._original(*args, **kwargs)
        result, halt = self.gate.step(self._original, args, kwargs)
        self.halt = self.halt or halt
        return result

    def after_step(self) -> None:
        pass

    def stop(self) -> None:
        if vars(self.engine).get("step") == self._step:
            del self.engine.step  # the class's own method again
        if self._hook is not None:
            self._hook.remove()


def start(callback: Any, args: Any, state: Any, trainer: Any) -> TrainerGate | DeepSpeedGate:
    if callback.engine is not None:
        return DeepSpeedGate(callback, callback.engine, state, trainer)
    if callback.options.recovery.snapshot_every:  # asked for; None (decided by the model) is off here
        raise OptionError("lossguard: LossguardCallback(recover=RecoverOptions(snapshot_every=...)) without "
                          "DeepSpeed is not supported yet (snapshots and rollback are built for the Trainer "
                          "under DeepSpeed, attach and Guard). Set snapshot_every=0: the gate still holds "
                          "faulty steps")
    if args.fp16:
        raise OptionError("lossguard: LossguardCallback(recover=...) with fp16=True and no DeepSpeed is not "
                          "supported yet (a held step would leave the GradScaler between unscale_ and update). "
                          "Use bf16, or DeepSpeed's fp16, or leave `recover` off")
    return TrainerGate(callback)


def end(gate: Any) -> bool:
    """At the step's end: put back what a held step shadowed; whether the run must halt now."""
    gate.after_step()
    return gate.halt


def stop(gate: Any) -> None:
    if isinstance(gate, DeepSpeedGate):
        gate.stop()
