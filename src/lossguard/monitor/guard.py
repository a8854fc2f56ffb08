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

`recover=True` (or `recover=lossguard.RecoverOptions(budget=3, window=100)`): the one line that changes
is the optimizer step, which the guard now gates; `guard.commit` takes the place of `guard.step`:

        loss.backward()
        if guard.commit(loss=loss, batch=batch):   # before the step: False holds it on every rank
            optimizer.step(); scheduler.step()
        optimizer.zero_grad()

A step whose loss or gradients are non-finite on any rank, or with a micro-batch whose labels are all
masked, is held on every rank together (monitor/recover.py): the optimizer and scheduler are not stepped,
the held gradients are dropped, weights and optimizer state stay exactly as they were. Past the budget the
run halts as with `halt_on` (LossguardHalt from `commit`, before the bad step is applied).

To have a held step replayed and classified instead of dropped (monitor/replay.py), let the guard hand out
the batches and give `commit` a closure that recomputes the loss of a batch:

    for batch in guard.batches(loader):                # records the RNG state, skips quarantined samples
        loss = model(**batch).loss
        loss.backward()
        if guard.commit(loss=loss, batch=batch, forward=lambda b: model(**b).loss):
            optimizer.step(); scheduler.step()
        optimizer.zero_grad()

A fault that does not come back on the replay is `transient` (the replay is committed); one that does is
traced to the sample(s) whose own loss is non-finite, which are quarantined (`quarantine.jsonl` in the
events dir, honoured by `batches` for the rest of the run and by a new Guard on the same events dir) and
the rest of the batch committed (`sample`); a micro-batch with every label masked is quarantined without a
replay. One micro-batch per optimizer step: with gradient accumulation (more than one batch from `batches`,
or micro-batch observed, per step) a held step is held whole, never replayed (said once at the first step).

Host snapshots of each rank's state (weights, optimizer, LR schedulers, the GradScaler's scale, RNG) every
10 steps when they fit in the host's free memory (decided at the first step, said in one line: monitor/
sizing.py; `RecoverOptions(snapshot_every=S)` sets it, 0 turns it off): weights that turn non-finite after a
step are rolled back on every rank to the same snapshot, the batches since it skipped (`rollback`, monitor/
snapshots.py). The LR scheduler is `scheduler=` or, without it, the schedulers bound to the optimizer
(monitor/restorable.py).

fp16 with a `torch.amp.GradScaler`: `Guard(model, optimizer, scaler=scaler)`, and `scaler.unscale_(optimizer)`
before `commit`; the scaler's overflows (it skips those steps itself) are then never held nor budget.

`exit_code_on_halt=N`: after a halt, closing the guard (`close()`, or leaving its `with` block) raises
`SystemExit(N)` on every rank, so the script ends with status N (`exit_after_halt`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from lossguard.monitor import (
    dist,
    quarantine,
    replay,
    restorable,
    shard_snapshots,
    sizing,
    snapshots,
    tensors,
)
from lossguard.monitor.core import Monitor
from lossguard.monitor.dtensor import is_dtensor
from lossguard.monitor.options import GuardOptions
from lossguard.monitor.sinks import say


class LossguardHalt(RuntimeError):
    """Raised on every rank at the same optimizer step when a finding matches `halt_on`."""

    def __init__(self, step: int, halted_at: int | None = None, checkpoint_dir: str | None = None) -> None:
        self.step = step
        self.checkpoint_dir = checkpoint_dir
        where = f"; checkpoint saved under {checkpoint_dir}" if checkpoint_dir else ""
        super().__init__(f"lossguard halted the run at optimizer step {step}{where}")


class Guard:
    def __init__(self, model: torch.nn.Module, optimizer: Any = None, *, scheduler: Any = None,
                 scaler: Any = None, **options: Any) -> None:
        """`scheduler`: the LR scheduler (or schedulers: a list) snapshots hold and restore with the
        optimizer's state; None: those bound to the optimizer, found at the first step when snapshots are
        on (monitor/restorable.py). `scaler`: the fp16 loop's `torch.amp.GradScaler`; its
        overflows (a non-finite gradient norm beside a finite loss, which `scaler.step` skips) are then its
        own business: never held, never counted against the budget, never a finding."""
        self._start(model, optimizer, GuardOptions(**options), _torch_facts(), "guard")
        self.scheduler = restorable.bundle(list(scheduler)) if isinstance(scheduler, (list, tuple)) else scheduler
        self.scaler = scaler

    @classmethod
    def for_entry(cls, model: torch.nn.Module, optimizer: Any, options: GuardOptions, *,
                  facts: dict[str, Any], entry: str) -> Guard:
        """The guard another entry point drives (the Lightning callback): its validated options, its facts."""
        guard = cls.__new__(cls)
        guard._start(model, optimizer, options, {**_torch_facts(), **facts}, entry)
        return guard

    def _start(self, model: Any, optimizer: Any, options: GuardOptions, facts: dict[str, Any], entry: str) -> None:
        self.options = options
        self.model = model
        self.optimizer = optimizer
        self.monitor = Monitor(options, model, optimizer=optimizer, facts=facts, entry=entry)
        self.num_steps = 0
        self.quarantine = quarantine.Quarantine(options.events_dir)
        self._shed = quarantine.Shedder(self.quarantine)
        self._rng: dict[str, Any] | None = None  # the RNG state the last batch of `batches` was handed out with
        self.scheduler = None
        self.scaler = None  # a dynamic loss scaler (torch.amp GradScaler): see `__init__`
        self.handed = 0  # batches `batches` has handed out: the data position a snapshot records
        self.ring: snapshots.Ring | None = None  # made at the first step when snapshots are on (`_plan`)
        self._jump_at: int | None = None  # the last step held for a loss jump that came back on its replay
        if options.recovery is not None:
            # FSDP2's DTensor shards are snapshotted (each rank its own); FSDP1's flat shards not yet: the gate
            # still holds a faulty step
            flat = any(not is_dtensor(p) for p, _ in self.monitor.sharded.sharded)
            why_not = "the model's parameters are FSDP1 flat shards, which snapshots do not hold yet (FSDP2's " \
                "DTensor shards they do; a faulty step is still held before it is applied)" if flat else None
            self.monitor.planner = sizing.Planner(
                self.monitor, lambda: (snapshots.Trainable(self.model), self._held(self.optimizer)), self._plan,
                why_not)

    def _plan(self, every: int) -> str:
        """Snapshots every `every` steps (0: off), the same on every rank (monitor/sizing.py); what a rollback
        will restore. Called inside the first step's exchange, before the gate judges that step."""
        if not every:
            return ""
        self.ring = snapshots.Ring(every, self.monitor.gate.options.keep)
        self.monitor.gate.watch_drift = True  # a drifted replica can be rolled back: the gate holds it
        self.monitor.gate.replay = True  # a held step's record waits for the rollback check
        found = self.scheduler is None
        if found:
            self.scheduler = restorable.bundle(restorable.find(self.optimizer))
        scheduler = "no LR scheduler (none given, none bound to the optimizer)" if self.scheduler is None else \
            f"the LR scheduler {restorable.name(self.scheduler)}" + (" (found)" if found else "")
        scale = ", the loss scale" if restorable.scaler_state(self.scaler) is not None else ""
        return f"weights, optimizer, {scheduler}{scale}, RNG"

    def batches(self, loader: Any) -> Iterator[Any]:
        """`loader`'s batches, each without its quarantined samples, the RNG state recorded as it is handed
        out (what a replay restores). In place of a batch whose every sample is quarantined a stand-in comes
        out (the last batch let through: the ranks must run the step together), and with `recover` on
        `commit` then returns False on every rank: the step is skipped alike everywhere, no recovery, no
        budget (monitor/quarantine.py `Shedder`)."""
        for batch in loader:
            self.handed += 1
            batch, emptied = self._shed(batch)
            if emptied and self.monitor.gate is not None:  # told to every rank in the step's exchange
                self.monitor.emptied = True
            if self.monitor.gate is not None:
                self._rng = replay.capture_rng()
            yield batch

    def observe(self, *, loss: torch.Tensor | None = None, batch: Any = None, labels: Any = None) -> None:
        """One micro-batch: its loss (before any filtering) and its batch or labels."""
        if labels is None and batch is not None:
            labels = tensors.find_labels((batch,), {})
        self.monitor.observe_micro(loss=loss, labels=labels)

    def step(self, *, loss: torch.Tensor | None = None, batch: Any = None, labels: Any = None,
             model: Any = None, optimizer: Any = None, grad_norm: Any = None, step: int | None = None,
             skipped: bool = False, lrs: list[float] | None = None) -> None:
        """End of one optimizer step (after `optimizer.step()`); raises `LossguardHalt` on a halt.

        `grad_norm`: pass what `clip_grad_norm_` returned; otherwise the norm of the gradients still
        present is computed. `skipped`: the step was not applied (e.g. GradScaler found inf). `lrs`: the
        learning rates of the optimizer's groups to record; otherwise those the optimizer holds now.
        """
        if self.monitor.gate is not None and not getattr(self, "_told", False) and self.monitor.rank == 0:
            self._told = True  # the step is already applied: only `commit` can hold it
            say("lossguard: recover is on but the loop calls guard.step() after optimizer.step(): nothing can "
                "be held; call `if guard.commit(loss=loss, batch=batch): optimizer.step()` instead")
        self._end(loss, batch, labels, model, optimizer, grad_norm, step, skipped, lrs, gating=False)

    def commit(self, *, loss: torch.Tensor | None = None, batch: Any = None, labels: Any = None,
               model: Any = None, optimizer: Any = None, grad_norm: Any = None, step: int | None = None,
               lrs: list[float] | None = None, forward: Callable[[Any], torch.Tensor] | None = None) -> bool:
        """End of one optimizer step, called after `backward()` and BEFORE `optimizer.step()`, in place of
        `step()`: True to apply the step (`optimizer.step()`, `scheduler.step()`), False to skip it.

        Same arguments as `step()`. With `recover` on, a faulty step returns False on every rank together
        (the decision comes from the per-step exchange, no extra collective) and the guard has set the
        gradients of the model's parameters to None. Raises `LossguardHalt` on a halt (a `halt_on` match,
        or the recovery budget spent), before the step is applied. The weights' fingerprint and update
        ratio are measured one step later than with `step()`: they are read before the update.

        `forward` (with `batch`): a closure returning the loss of a batch; a held step is then replayed
        and classified on every rank together (True when the replay or the batch's kept samples are to
        be committed: their gradients are in place). Use `batches(loader)` for the RNG state."""
        self.monitor.lag = 1
        replaying = forward is not None and batch is not None and self.monitor.gate is not None \
            and self.monitor.gate.options.replay
        refused = self._accumulating(loss is not None or batch is not None or labels is not None) \
            if replaying else None
        if self.monitor.gate is not None:  # with snapshots, the held step's record waits for the rollback check
            self.monitor.gate.replay = replaying or self.ring is not None
        self._end(loss, batch, labels, model, optimizer, grad_norm, step, False, lrs, gating=True)
        hold = self.monitor.held
        if hold is None:
            self._snapshot(model or self.model, optimizer or self.optimizer)
            return True
        if hold.skip:  # some rank's batch held only quarantined samples: every rank skips the step
            self._drop(model or self.model)
            return False
        if self.ring is not None and self._rolled_back(hold, model or self.model, optimizer or self.optimizer,
                                                       replaying):
            return False
        if replaying:
            replayer = replay.Replayer(self.monitor, model or self.model, self.quarantine,
                                       defer_jump=self.ring is not None, refused=refused)
            try:  # `forward` errors are caught per rank inside and travel in the exchange: all ranks agree
                if replayer.classify(hold, batch, forward, self._rng):
                    return True
            except Exception as exc:  # past that (the recompute, the exchange itself): report, hold the step
                self.monitor._fail(exc, "replay")
            # A jump that comes back on the replay of its own batch: that batch's (hold it), unless the step
            # before was held for the same reason on another batch; two batches in a row that jump are the
            # weights' fault (the state): roll back. Rolling back on one batch would throw away good steps
            # for what one hard batch did. Every rank sees the same outcome, so takes the same path.
            jumped_before, self._jump_at = self._jump_at == hold.step - 1, \
                (hold.step if replayer.outcome == "jump" else None)
            if replayer.outcome == "jump" and self.ring is not None:  # the replayer left the record to us
                outcome = snapshots.rollback(self.monitor, self.ring, hold, self._position() + 1,
                                             snapshots.Trainable(model or self.model),
                                             self._held(optimizer or self.optimizer), self.scheduler, jump=True,
                                             scaler=restorable.scaler_state(self.scaler)) \
                    if jumped_before else "none"
                if outcome == "none":
                    replayer.record_jump()
        self._drop(model or self.model)
        return False

    @staticmethod
    def _drop(model: Any) -> None:
        for param in model.parameters():
            param.grad = None  # as `zero_grad()` does: the held gradients must not join the next step's

    def _accumulating(self, observed: bool) -> str | None:
        """Why this step cannot be replayed (None: it can): gradient accumulation, seen as more than one
        batch handed out by `batches`, or more than one micro-batch observed, since the last step. `forward`
        recomputes one batch: replaying the last micro-batch alone and committing it would change the run
        while reporting it recovered, so such a step is held whole. Said once, at the first step that shows
        it. Each rank's own count: told to the others in the replay's exchange, so every rank holds."""
        handed, self._handed_then = self.handed - getattr(self, "_handed_then", 0), self.handed
        micro = max(handed, len(self.monitor._micro) + int(observed))
        if micro <= 1 and not getattr(self, "_refused", None):
            return None
        if not getattr(self, "_refused", None):
            self._refused = (f"gradient accumulation ({micro} micro-batches per optimizer step): a held step is "
                             "not replayed, since `forward` recomputes one batch and committing it alone would "
                             "change the run; such steps are held whole")
            if self.monitor.rank == 0 and self.monitor.options.console:
                say(f"lossguard: {self._refused} (commit(forward=...) replays one micro-batch per step)")
        return self._refused

    def _position(self) -> int:
        """Batches handed out before the current step's (one per step when the loop does not use `batches`)."""
        return (self.handed or self.num_steps) - 1

    def _held(self, optimizer: Any) -> Any:
        """The optimizer as the ring holds it: over FSDP2 parameters, its state's local shards."""
        if self.monitor.sharded and shard_snapshots.holds(optimizer, self.model):
            return shard_snapshots.OptimizerShards(optimizer)
        return optimizer

    def _snapshot(self, model: Any, optimizer: Any) -> None:
        """The state before this committed step is applied, every S steps (the step number decides: every
        rank takes it at the same step, no collective). A failure here is this rank's: `decide` only rolls
        back to a snapshot every rank holds."""
        if self.ring is None or self.monitor.disabled or not self.ring.due(self.num_steps):
            return
        try:
            self.ring.take(self.num_steps, self._position(), snapshots.Trainable(model), self._held(optimizer),
                           self.scheduler,
                           restorable.scaler_state(self.scaler))
        except Exception as exc:
            self.monitor._fail(exc, "snapshot")

    def _rolled_back(self, hold: Any, model: Any, optimizer: Any, replaying: bool) -> bool:
        """Snapshots on and the step held: roll back when some rank's weights are non-finite (every rank
        together), halt when there is nothing to go back to; else the gate's own path, its record written."""
        outcome = snapshots.rollback(self.monitor, self.ring, hold, self._position() + 1,
                                     snapshots.Trainable(model), self._held(optimizer), self.scheduler,
                                     scaler=restorable.scaler_state(self.scaler))
        if outcome == "halt":
            self.monitor.halted_at = hold.step
            raise LossguardHalt(hold.step)
        if outcome == "rolled":
            self._drop(model)  # FSDP2: the ring saw the local shards, the gradients sit on the DTensors
            return True
        if not replaying:  # the held step's record, which `Monitor._hold` left to this check
            self.monitor.gate.replay = False
            self.monitor._hold(hold, [])
        return False

    def _end(self, loss, batch, labels, model, optimizer, grad_norm, step, skipped, lrs, *, gating: bool) -> None:
        if loss is not None or batch is not None or labels is not None:
            self.observe(loss=loss, batch=batch, labels=labels)
        self.num_steps += 1
        self._skipped = getattr(self, "_skipped", 0) + int(bool(skipped))
        optimizer = optimizer or self.optimizer
        model = model or self.model
        if grad_norm is None and not self.monitor.disabled and not self.monitor.sharded:  # FSDP: the monitor's
            try:
                grad_norm = tensors.grad_norm(p for p in model.parameters() if p.requires_grad)
            except Exception:
                grad_norm = None
        if lrs is None and optimizer is not None:
            lrs = [float(g["lr"]) for g in optimizer.param_groups]
        scaler_scale = _scale(self.scaler)
        if scaler_scale is not None and not skipped:  # the scaler's skips are read from the norm (core.py)
            skipped_steps = None
        else:
            skipped_steps = self._skipped
        step_no = self.num_steps if step is None else step
        if self.monitor.end_step(step_no, grad_norm=grad_norm, lrs=lrs, loss_scale=scaler_scale,
                                 skipped_steps=skipped_steps, gating=gating):
            raise LossguardHalt(step_no)

    def close(self) -> None:
        """Finish the run's analysis and the events file; after a halt with `exit_code_on_halt`, exit."""
        self.monitor.close()
        exit_after_halt(self.monitor)

    def __enter__(self) -> Guard:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc is None or isinstance(exc, LossguardHalt):
            self.close()
        else:  # another error is on its way out: finish the events file, let the error decide the status
            self.monitor.close()


def _scale(scaler: Any) -> Any:
    """The scaler's current scale as the device tensor it keeps (`get_scale()` would wait for the device);
    None without an enabled scaler or before its first `scale()`."""
    try:
        if scaler is None or not scaler.is_enabled():
            return None
        return getattr(scaler, "_scale", None)
    except Exception:
        return None


def exit_after_halt(monitor: Monitor | None) -> None:
    """`SystemExit(options.exit_code_on_halt)` when the run halted and that option is set; else nothing.

    Every entry point calls it where its training has returned, after the halt's checkpoint: the end of
    `Trainer.train` (HF `on_train_end`), of `Trainer.fit` (Lightning `teardown`), `Guard.close()`,
    `detach()`. The halt was decided on every rank at the same step, so every rank gets here. One barrier
    first: a launcher stops the other ranks as soon as one exits non-zero, and a rank still writing its part
    of the checkpoint must not be stopped mid-write. An exception, not `os._exit`: `finally` blocks, atexit
    handlers (loggers, wandb) and the interpreter's own teardown run as after any `sys.exit`; only the
    script's code after the training call is skipped, which is the point (a halted run's final weights must
    not be saved or pushed as a result). An atexit hook cannot set the status without `os._exit`, which
    would cut the other handlers short."""
    if monitor is None or monitor.halted_at is None or monitor.options.exit_code_on_halt is None:
        return
    code = monitor.options.exit_code_on_halt
    try:
        dist.barrier()
    except Exception as exc:  # a rank already gone: exit all the same
        say(f"lossguard: rank {monitor.rank}: the barrier before exiting failed ({type(exc).__name__}: {exc})")
    if monitor.rank == 0:
        say(f"lossguard: exiting with status {code} (exit_code_on_halt): the run halted at step {monitor.halted_at}")
    raise SystemExit(code)


def _torch_facts() -> dict[str, Any]:
    return {"torch_version": torch.__version__, "entry_point": "guard"}
