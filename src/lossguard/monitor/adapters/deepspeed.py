"""`lossguard.attach(engine)`: the live guard on a raw DeepSpeed engine.

Wraps the engine instance's `forward`, `backward` and `step` (the class is untouched): the forward
hook reads the labels, `backward` the raw loss, and `step` at an accumulation boundary ends the
optimizer step. On a halt every rank saves a checkpoint (when `halt_checkpoint_dir` is set) and
`step()` raises `LossguardHalt`; with `exit_code_on_halt`, `detach()` then exits with that status.

`attach(engine, recover=True)` (or `recover=lossguard.RecoverOptions(budget=..., window=...)`): no change to
the loop. A step whose loss is non-finite on any rank, or with a micro-batch whose labels are all masked,
is held on every rank inside `engine.step()` (`EngineGate`): weights, fp32 master and optimizer state, LR
scheduler and loss scale stay exactly as before it, under ZeRO-0/1/2/3, fp32, bf16 and fp16. Past the
budget the run halts as above. `RecoverOptions(snapshot_every=S)`: host snapshots of each rank's own shard
and rollback of weights that turned non-finite (ds_snapshots.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from lossguard.monitor import quarantine, replay, restorable, sizing, snapshots, tensors
from lossguard.monitor.adapters import ds_hold, ds_norm, ds_replay, ds_snapshots
from lossguard.monitor.core import Monitor
from lossguard.monitor.guard import LossguardHalt, exit_after_halt
from lossguard.monitor.options import GuardOptions, OptionError


def engine_facts(engine: Any) -> dict[str, Any]:
    """RunFacts fields the engine knows (versions, ZeRO stage, precision, overlap_comm, ...)."""
    import deepspeed

    facts: dict[str, Any] = {"deepspeed_version": deepspeed.__version__, "entry_point": "deepspeed"}
    for name, getter in (("zero_stage", "zero_optimization_stage"), ("bf16", "bfloat16_enabled"),
                         ("fp16", "fp16_enabled"), ("gradient_accumulation_steps", "gradient_accumulation_steps"),
                         ("overlap_comm", "zero_overlap_comm"), ("contiguous_gradients", "zero_contiguous_gradients")):
        with contextlib.suppress(Exception):
            facts[name] = getattr(engine, getter)()
    try:
        facts["reduce_bucket_size"] = engine.zero_reduce_bucket_size()
        facts["check_grad_overflow"] = bool(getattr(engine.optimizer, "check_grad_overflow", None) or False) \
            if facts.get("bf16") else None
    except Exception:
        pass
    return {k: v for k, v in facts.items() if v is not None}


def engine_signals(engine: Any) -> dict[str, Any]:
    """grad_norm (before clipping), lrs, loss_scale, skipped_steps as the engine reports them (device
    tensors kept). The LRs are those of the moment: read before `engine.step()` they are the step's."""
    out: dict[str, Any] = {"skipped_steps": getattr(engine, "skipped_steps", None)}
    try:
        out["grad_norm"] = engine.get_global_grad_norm()
    except Exception:
        out["grad_norm"] = None
    out["lrs"] = _engine_lrs(engine)
    if engine.fp16_enabled():
        optimizer = engine.optimizer
        scale = getattr(optimizer, "loss_scale", None)
        if scale is None:
            scale = getattr(getattr(optimizer, "loss_scaler", None), "cur_scale", None)
        out["loss_scale"] = scale
    return out


def _engine_lrs(engine: Any) -> list[float] | None:
    try:
        return [float(lr) for lr in engine.get_lr()]
    except Exception:
        return None


class EngineGate:
    """`recover` on a DeepSpeed engine: the commit gate at each accumulation boundary's `engine.step()`.

    The step's exchange runs before the step (loss and labels of its micro-batches; the LRs it will use);
    a held step takes DeepSpeed's own overflow path on every rank (ds_hold.py); a committed one is stepped
    and its post-step signals (grad norm, skips, loss scale, which exist only after the step) are kept for
    the next exchange (monitor/deferred.py). A halt (the budget spent, or a finding on the step before)
    comes before this step is applied: the step is held, and the caller halts. Each rank's partition norm,
    read before the step, judges a loss jump's update (ds_norm.py). Gradients that turn non-finite while
    the loss is finite are left to DeepSpeed, which skips such a step itself
    (ZeRO-1/2 `check_grad_overflow`, ZeRO-3 and the bf16 optimizer on an invalid norm, fp16's scaler), and
    the guard reports it as a skipped step with the next exchange."""

    def __init__(self, engine: Any, monitor: Monitor, step_number: Callable[[], int],
                 replay_from: ds_replay.Source | None = None, scheduler: Callable[[], Any] | None = None) -> None:
        self.engine = engine
        self.monitor = monitor
        self.step_number = step_number  # the number a step ends as, read before it
        self.last_step = 0
        # the captured batch and how to recompute it: replay a held step (ds_replay.py)
        self.replay_from = replay_from
        monitor.lag = 1  # fingerprints and update ratios are read before the step
        monitor.deferred = True
        # the norm sent before the step is this rank's partition's (ds_norm.py): a non-finite one beside a
        # finite loss is DeepSpeed's own overflow check's to skip (fp16 lowers its scale), as before
        monitor.gate.engine_overflow = True
        why = ds_snapshots.supported(engine)
        if why is not None and monitor.gate.options.snapshot_every:  # asked for: refused here, at the start
            raise OptionError(f"lossguard: recover.snapshot_every needs an optimizer whose state lossguard knows; "
                              f"this engine's is {why}. Set snapshot_every=0 (the gate still holds faulty steps)")
        self.ring: snapshots.Ring | None = None  # made at the first step when snapshots are on (`_plan`)
        self._jump_at: int | None = None  # the last step held for a loss jump that came back on its replay
        self.shard, self.optimizer_state = ds_snapshots.ShardState(engine), ds_snapshots.OptimizerState(engine)
        self.given = scheduler or (lambda: engine.lr_scheduler)
        self.found: Any = None  # the LR schedulers bound to the optimizer, when none was given (restorable.py)
        monitor.planner = sizing.Planner(monitor, lambda: (self.shard, self.optimizer_state), self._plan,
                                         None if why is None else f"this engine's optimizer is {why}")

    def scheduler(self) -> Any:
        """The LR scheduler a snapshot holds: the one given (the engine's, the Trainer's), else those found."""
        return self.given() or self.found

    def _plan(self, every: int) -> str:
        """Snapshots every `every` steps (0: off), alike on every rank (monitor/sizing.py); what a rollback
        restores. Called inside the first step's exchange, before the gate judges that step."""
        if not every:
            return ""
        self.ring = snapshots.Ring(every, self.monitor.gate.options.keep)
        self.monitor.gate.watch_drift = True  # a drifted replica can be rolled back: held
        self.monitor.gate.replay = True  # a held step's record waits for the rollback check
        given = self.given()
        if given is None:
            inner = getattr(self.engine.optimizer, "optimizer", None)
            self.found = restorable.bundle(restorable.find(self.engine.optimizer, inner))
        held = given or self.found
        scheduler = "no LR scheduler (none given, none bound to the optimizer)" if held is None else \
            f"the LR scheduler {restorable.name(held)}" + (" (found)" if given is None else "")
        return f"this rank's shard of the weights, optimizer state and loss scale, {scheduler}, RNG"

    def step(self, run_step: Callable[..., Any], args: tuple, kwargs: dict) -> tuple[Any, bool]:
        """(what `engine.step()` returned, None when held; whether the run must halt now)."""
        self.last_step = step = self.step_number()
        capture = self.replay_from.capture if self.replay_from is not None else None
        replaying = capture is not None and capture.ready() and self.monitor.gate.options.replay \
            and self.engine.gradient_accumulation_steps() == 1
        # the replay, or the rollback check, writes the held step's record
        self.monitor.gate.replay = replaying or self.ring is not None
        if capture is not None and capture.emptied:  # told to every rank in the step's exchange
            self.monitor.emptied = True
        try:
            # the norm of this rank's gradients before the step: a loss jump with an ordinary update is data,
            # committed (ds_norm.py); the record keeps the engine's own norm, read after the step
            halt = self.monitor.end_step(step, grad_norm=self._norm(), lrs=_engine_lrs(self.engine), gating=True)
            hold = self.monitor.held
            if hold is not None and hold.skip:  # a batch left empty by the quarantine: skipped on every rank
                ds_hold.hold(self.engine, lambda: run_step(*args, **kwargs))
                return None, halt
            if hold is not None and self.ring is not None and not halt:
                outcome = self._rolled_back(hold, step, replaying)
                if outcome != "none":
                    ds_hold.hold(self.engine, lambda: run_step(*args, **kwargs))
                    return None, outcome == "halt"
            if hold is not None and replaying and not halt:
                return (self._commit(run_step, args, kwargs) if self._replayed(hold, run_step, args, kwargs)
                        else None), False
            if hold is not None and replaying:  # halting instead: the held step's own record
                self.monitor.gate.replay = False
                self.monitor._hold(hold, [])
            if halt or hold is not None:
                ds_hold.hold(self.engine, lambda: run_step(*args, **kwargs))
                return None, halt
            return self._commit(run_step, args, kwargs), False
        finally:
            if capture is not None:
                capture.reset()

    def _norm(self) -> Any:
        try:  # a device op; never raised into the user's step
            return ds_norm.pre_step_norm(self.engine)
        except Exception as exc:
            self.monitor._fail(exc, "pre-step grad norm", raise_ok=False)
            return None

    def _rolled_back(self, hold: Any, step: int, replaying: bool) -> str:
        """Snapshots on and the step held: "rolled" (every rank restored the same snapshot), "halt" (non-
        finite weights, nothing to go back to), or "none" (the held step's record written unless a replay
        follows). The same on every rank (monitor/snapshots.py)."""
        outcome = snapshots.rollback(self.monitor, self.ring, hold, step - 1, self.shard, self.optimizer_state,
                                     self.scheduler())
        if outcome == "halt":
            self.monitor.halted_at = hold.step
        elif outcome == "none" and not replaying:
            self.monitor.gate.replay = False
            self.monitor._hold(hold, [])
        return outcome

    def _commit(self, run_step: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        if self.ring is not None and self.ring.due(self.last_step):  # the state before this step is applied
            try:
                self.ring.take(self.last_step, self.last_step - 1, self.shard, self.optimizer_state,
                               self.scheduler())
            except Exception as exc:  # this rank's alone: a rollback only goes to a snapshot every rank holds
                self.monitor._fail(exc, "snapshot")
        result = run_step(*args, **kwargs)
        signals = engine_signals(self.engine)
        self.monitor.after_step(grad_norm=signals["grad_norm"], loss_scale=signals.get("loss_scale"),
                                skipped_steps=signals["skipped_steps"])
        return result

    def _replayed(self, hold: Any, run_step: Callable[..., Any], args: tuple, kwargs: dict) -> bool:
        """Replay and classify the held step on every rank (monitor/replay.py); True: commit it."""
        source = self.replay_from
        run = lambda: run_step(*args, **kwargs)  # noqa: E731
        ops = ds_replay.DeepSpeedOps(self.engine, run, source)
        replayer = replay.Replayer(self.monitor, None, source.capture.held, ops=ops,
                                   defer_jump=self.ring is not None)
        try:
            ok = replayer.classify(hold, source.capture.batch, source.forward, source.capture.rng)
        except Exception as exc:  # past the errors `classify` shares: report, hold the step
            self.monitor._fail(exc, "replay")
            if replayer.dirty:
                ds_hold.hold(self.engine, run, counted=False)
            ok = False
        # A jump that comes back on its own batch's replay is that batch's (held), unless the step before
        # jumped too on another batch: then the weights are at fault, roll back (as Guard.commit does).
        jumped_before = self._jump_at == hold.step - 1
        self._jump_at = hold.step if replayer.outcome == "jump" else None
        if replayer.outcome == "jump" and self.ring is not None and (not jumped_before or snapshots.rollback(
                self.monitor, self.ring, hold, hold.step - 1, self.shard, self.optimizer_state, self.scheduler(),
                jump=True) == "none"):
            replayer.record_jump()
        if not ok:
            ds_hold.count_skipped(self.engine)
        return ok


class Attachment:
    """What `attach` returns: the monitor plus `detach()`."""

    def __init__(self, engine: Any, options: GuardOptions, halt_checkpoint_dir: str | None,
                 entry: str = "deepspeed", facts: dict[str, Any] | None = None) -> None:
        self.engine = engine
        self.halt_checkpoint_dir = halt_checkpoint_dir
        module = engine.module
        self.monitor = Monitor(options, module, optimizer=engine.optimizer,
                               facts={**engine_facts(engine), **(facts or {})}, entry=entry)
        self.quarantine = quarantine.Quarantine(options.events_dir)
        self.capture = ds_replay.Capture(self.quarantine) if self.monitor.gate is not None else None
        self.gate = EngineGate(engine, self.monitor, lambda: engine.global_steps + 1,
                               ds_replay.raw_source(engine, self.capture, engine.backward)) \
            if self.monitor.gate is not None else None
        self._labels: list[Any] = []
        self._hook = module.register_forward_pre_hook(self._pre_forward, with_kwargs=True)
        self._orig_backward, self._orig_step = engine.backward, engine.step
        engine.backward, engine.step = self._backward, self._step

    def batches(self, loader: Any) -> Iterator[Any]:
        """`loader`'s batches without the samples a `sample` recovery quarantined (this run's, and those in
        the events dir's `quarantine.jsonl` from before a resume): `for batch in guard.batches(loader):`."""
        shed = quarantine.Shedder(self.quarantine)
        for batch in loader:
            batch, emptied = shed(batch)
            if emptied and self.monitor.gate is not None:  # told to every rank in the step's exchange
                self.monitor.emptied = True
            yield batch

    def _pre_forward(self, module, args, kwargs):
        changed = None
        if self.capture is not None:
            if self.capture.off:  # the replay's own forward: the step's labels are already counted
                return None
            changed = self.capture.record(module, args, kwargs)  # quarantined samples left out
            if changed is not None:
                args, kwargs = changed
        labels = tensors.find_labels(args, kwargs)
        if labels is not None:
            self._labels.append(labels)
        return changed

    def _backward(self, loss, *args, **kwargs):
        labels = self._labels.pop() if self._labels else None
        self._labels.clear()
        self.monitor.observe_micro(loss=loss, labels=labels)
        return self._orig_backward(loss, *args, **kwargs)

    def _step(self, *args, **kwargs):
        boundary = self.engine.is_gradient_accumulation_boundary()
        if boundary and self.gate is not None:
            return self._gated_step(args, kwargs)
        # The LRs this optimizer step uses: `engine.step()` steps the engine's LR scheduler after the
        # optimizer, so what `get_lr()` says afterwards is the next step's.
        lrs = _engine_lrs(self.engine) if boundary else None
        result = self._orig_step(*args, **kwargs)
        if boundary:
            step = self.engine.global_steps
            signals = engine_signals(self.engine)
            if lrs is not None:
                signals["lrs"] = lrs
            if self.monitor.end_step(step, **signals):
                self._halt(step)
        return result

    def _gated_step(self, args: tuple, kwargs: dict) -> Any:
        result, halt = self.gate.step(self._orig_step, args, kwargs)
        if halt:
            self._halt(self.gate.last_step)
        return result

    def _halt(self, step: int) -> None:
        if self.halt_checkpoint_dir is not None:
            self.engine.save_checkpoint(self.halt_checkpoint_dir, tag=f"lossguard-halt-step{step}")
        raise LossguardHalt(step, self.monitor.halted_at, self.halt_checkpoint_dir)

    def detach(self) -> None:
        """Unwrap the engine and finish the events file; after a halt with `exit_code_on_halt`, exit."""
        self._hook.remove()
        self.engine.backward, self.engine.step = self._orig_backward, self._orig_step
        self.monitor.close()
        exit_after_halt(self.monitor)


def attach(engine: Any, *, halt_checkpoint_dir: str | None = None, **options: Any) -> Attachment:
    """Guard a DeepSpeed engine in place. Options: see `GuardOptions` (events_dir, halt_on, ...)."""
    return Attachment(engine, GuardOptions(**options), halt_checkpoint_dir)
