"""The commit gate (`recover=True`, tier 1): hold a faulty step on every rank before it is applied.

`Guard.commit` (and, with no change to the loop, `attach`'s wrapped `engine.step()` and the Trainer
callback's `on_pre_optimizer_step`: adapters/deepspeed.py, adapters/hf_gate.py) runs the guard's per-step
exchange before `optimizer.step()`. Every rank then holds every
rank's row (below the world-size threshold; above it the summary, and the rows whenever the summary shows a
non-finite or zero value, which every fault here is), so every rank reads the same faults from the same
numbers and reaches the same decision: commit on all ranks, or hold on all ranks. No extra collective.

A fault the gate holds: a non-finite loss on any rank, a non-finite gradient norm on any rank (unless a
dynamic loss scaler is in charge and the loss is finite: an fp16 overflow the scaler skips and answers by
lowering its scale, its own business, never a fault nor budget), a micro-batch whose labels are all masked
(fewest label tokens 0), and a loss on some rank far above the run's spread together with a gradient norm
far above the run's norms (monitor/jump.py: a high loss alone is data). A held step is not fed to the detectors (it was not
applied: it is not part of the run's trajectory, and a detector that reports a fault once must still see a
later, real one); it is written to every rank's events file as a `recovery` line with the values that
triggered it, and `lossguard analyze` lists it under `recoveries`.

When `Guard.commit` is given the batch and a `forward` closure, the held step is then replayed to tell a
transient fault from a reproducible one (`transient` / `sample`, with quarantine: monitor/replay.py), which
writes the line instead; without them the step is `held`: the batch dropped. With snapshots on, a held step whose cause
is non-finite weights is rolled back first (`rollback`: monitor/snapshots.py).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from lossguard.monitor import summary, wire
from lossguard.monitor.jump import LossHistory
from lossguard.monitor.options import RecoverOptions

# (what the gate calls the fault, the slot it is read from, the signature and the detector code that names
# the same fault when it is applied: LOSS001 for a non-finite loss or gradient, LABEL001 for masked labels,
# LOSS006 for a loss spike). Causes first: a micro-batch with no label token also gives a NaN loss (a mean
# over no token), and the step's signature is the first fault's; a jump is judged on the finite losses
# only, so a step that also has a non-finite value is named by that first.
JUMP = "loss jump far above the run's spread"
EMPTIED = "batch left empty by the quarantine"
DRIFT = "weights differ between replicas"
_FAULTS = (("all labels masked in a micro-batch", wire.MIN_LABELS, "masked-labels", "LABEL001"),
           ("non-finite loss", wire.RAW_LOSS, "nonfinite", "LOSS001"),
           ("non-finite gradient norm", wire.GRAD_NORM, "nonfinite", "LOSS001"),
           (DRIFT, wire.FINGERPRINT, "rank-desync", "RANK001"),
           (JUMP, wire.RAW_LOSS, "loss-spike", "LOSS006"))
# Replicas whose fingerprints differ by more than this (relative) have drifted: the offline RANK001 test.
DRIFT_TOLERANCE = 1e-6
_BY_SLOT = _FAULTS[:3]  # read value by value; the jump against the gate's history (monitor/jump.py)
_BITS = {wire.RAW_LOSS: wire.HAS_LOSS, wire.GRAD_NORM: wire.HAS_GRAD_NORM, wire.MIN_LABELS: wire.HAS_LABELS}
ACTION = "held: optimizer.step() skipped on every rank, the held gradients dropped, the batch not replayed"
# Transient faults on one rank within the window that make it a suspect device: one can be a cosmic ray or a
# one-off; two on the same rank, each clean on replay, is a pattern worth a look at that GPU.
SUSPECT_AFTER = 2


@dataclass
class Hold:
    """The gate's decision on one step, the same on every rank."""

    step: int
    faults: list[dict[str, Any]]  # {"fault", "ranks", "values": {rank: value}}
    give_up: bool = False  # the budget is spent: halt instead of holding
    skip: bool = False  # some rank's batch held only quarantined samples: skipped, not a recovery
    used: int = 0  # held steps within the window, this one included when held

    @property
    def ranks(self) -> list[int]:
        """The ranks the fault started on: those of the first fault in cause order (a rank whose own loss is
        non-finite, not every rank whose gradients the all-reduce averaged it into)."""
        return sorted(self.faults[0]["ranks"])

    @property
    def signature(self) -> str:
        return _first(self.faults, 2)

    @property
    def jump_limit(self) -> float | None:
        """The loss above which the step was a jump (a replay is judged by it), None unless one was held."""
        return next((f["limit"] for f in self.faults if f["fault"] == JUMP), None)

    @property
    def norm_limit(self) -> float | None:
        """The gradient norm above which the held jump's update was abnormal, None unless one was measured."""
        return next((f.get("norm_limit") for f in self.faults if f["fault"] == JUMP), None)

    @property
    def code(self) -> str:
        return _first(self.faults, 3)


def _first(faults: list[dict[str, Any]], index: int) -> str:
    name = faults[0]["fault"]
    return next(entry[index] for entry in _FAULTS if entry[0] == name)


@dataclass
class Gate:
    options: RecoverOptions
    held_steps: deque = field(default_factory=deque)
    num_held: int = 0
    replay: bool = False  # set by `Guard.commit` when it will replay a held step (monitor/replay.py)
    losses: LossHistory = field(default_factory=LossHistory)  # every step's highest loss (monitor/jump.py)
    norms: LossHistory = field(default_factory=lambda: LossHistory(norm=True))  # and its highest grad norm
    transients: dict = field(default_factory=dict)  # rank -> steps whose fault there did not come back on replay
    # with snapshots on: a step whose replicas' fingerprints differ is held, and rolled back (holding alone
    # cannot bring drifted replicas together)
    watch_drift: bool = False
    # what each recovery within the window did (step -> its `recovery` line): the budget's halt says what recurred
    recent: dict = field(default_factory=dict)
    # a DeepSpeed gate: the norm a rank sends before the step is its own partition's (adapters/ds_norm.py), read
    # for the jump test; a non-finite one beside a finite loss is left to DeepSpeed's own overflow check, which
    # skips that step (and under fp16 lowers the scale: a held step would leave the scale where it overflows)
    engine_overflow: bool = False

    def note(self, event: dict[str, Any]) -> None:
        """Remember a recovery as it was written (held, replayed, quarantined, rolled back), for the halt."""
        self.recent = {step: e for step, e in self.recent.items() if event["step"] - step < self.options.window}
        self.recent[event["step"]] = event

    def suspects(self, step: int, ranks: list[int]) -> dict[int, int]:
        """Note a `transient` fault on `ranks`; {rank: transient faults within the window} for the ranks with
        SUSPECT_AFTER or more. A fault that does not come back when the same batch is replayed with the same
        RNG state is not the data's and not the run's; the same rank doing that again, while the others stay
        clean, points at that rank's device (silent data corruption, a failing GPU or its memory)."""
        out = {}
        for rank in ranks:
            steps = [s for s in self.transients.get(rank, []) if step - s < self.options.window] + [step]
            self.transients[rank] = steps
            if len(steps) >= SUSPECT_AFTER:
                out[rank] = len(steps)
        return out

    def judge(self, step: int, rows: list[list[float]] | None, seen: summary.Summary | None) -> Hold | None:
        """None: commit. Decided from the gathered rows (or the reduced summary), so alike on every rank, and
        so is the loss history each rank keeps. A step where some rank's batch was left empty by the
        quarantine is skipped on every rank before anything else is read: nothing was learned from it, so
        it is no fault, spends no budget and leaves the loss history as it was (an emptied rank sends no
        label token, so a summarised step gathers its rows: the skip is always read from them)."""
        emptied = [rank for rank, row in enumerate(rows) if wire.emptied(row)] if rows is not None else []
        if emptied:
            return Hold(step, [{"fault": EMPTIED, "ranks": emptied, "values": {}}], skip=True)
        faults = _from_rows(rows, self.engine_overflow) if rows is not None else _from_summary(seen, self.engine_overflow)
        peak, norm = _peak(rows, seen), _peak(rows, seen, wire.GRAD_NORM)
        drift = _drift(rows) if self.watch_drift and rows is not None else None
        jump = _jump(self.losses.bound(), peak, rows, self.norms.bound(), norm, _measured(rows, seen))
        faults.extend(f for f in (drift, jump) if f is not None)
        self.losses.commit(peak, held=bool(faults))
        self.norms.commit(norm, held=bool(faults))
        if not faults:
            return None
        while self.held_steps and step - self.held_steps[0] >= self.options.window:
            self.held_steps.popleft()
        if len(self.held_steps) >= self.options.budget:
            return Hold(step, faults, give_up=True, used=len(self.held_steps))
        self.held_steps.append(step)
        self.num_held += 1
        return Hold(step, faults, used=len(self.held_steps))

    def event(self, hold: Hold) -> dict[str, Any]:
        """The `recovery` line every rank writes to its events file (noted for the halt; a replay or a rollback
        notes its own line over it)."""
        line = {"type": "recovery", "step": hold.step, "ranks": hold.ranks, "kind": "held", "samples": [],
                "steps_lost": 1, "signature": hold.signature, "code": hold.code, "action": ACTION,
                "faults": hold.faults,
                "budget": {"used": hold.used, "budget": self.options.budget, "window": self.options.window}}
        self.note(line)
        return line

    def skip_event(self, hold: Hold) -> dict[str, Any]:
        """The `skip` line every rank writes for a step skipped because a batch was left empty."""
        return {"type": "skip", "step": hold.step, "ranks": hold.ranks, "why": EMPTIED,
                "action": "skipped: optimizer.step() not run on any rank, the step's gradients dropped"}

    def console_line(self, hold: Hold) -> str:
        if hold.skip:
            return (f"lossguard: skipped step {hold.step} on every rank: the batch of rank(s) "
                    f"{', '.join(map(str, hold.ranks))} held only quarantined samples")
        what = describe(hold.faults)
        if hold.give_up:
            return (f"lossguard: halting at step {hold.step} on every rank: {what} ({hold.code}, {hold.signature}); "
                    f"the recovery budget is spent ({hold.used} steps held within {self.options.window}, "
                    f"budget {self.options.budget}); {why_halt(hold, self.recent)}")
        return (f"lossguard: recovered at step {hold.step}: {what} ({hold.code}, {hold.signature}); the step "
                f"was held on every rank (no optimizer step, gradients dropped); {hold.used} of "
                f"{self.options.budget} recoveries within {self.options.window} steps used")


def why_halt(hold: Hold, recent: dict[int, dict[str, Any]]) -> str:
    """Why the budget ran out, in words: where the fault recurred, the data it named, what would quarantine it."""
    events = [recent[step] for step in sorted(recent)]
    ranks = sorted({r for e in events for r in e.get("ranks", [])} | set(hold.ranks))
    steps = ", ".join(str(e["step"]) for e in events) + (", " if events else "") + str(hold.step)
    said = f"it recurred at steps {steps}, on rank(s) {', '.join(map(str, ranks)) or '?'}"
    named = [s for e in events for s in e.get("samples", [])]
    if named:
        who = ", ".join(f"hash {s.get('hash')}" + (f" (index {s['index']})" if s.get("index") is not None else "")
                        for s in named[:4])
        return (f"{said}; quarantined on the way: {who}; it came back without them, so other data or the "
                "state is at fault (inspect the batches of those steps, or roll back: snapshot_every)")
    if any(e.get("replay") for e in events):
        return (f"{said}; each replay faulted again and no sample's own loss did: the state, not the data "
                "(snapshots would roll it back: RecoverOptions(snapshot_every=...))")
    return (f"{said}; no sample was named, the steps were held without a replay: quarantining the data needs "
            "a replay (Guard.commit(forward=...) over guard.batches(loader), attach(engine), or the Trainer "
            "under DeepSpeed; the Trainer without DeepSpeed and Lightning hold only)")


def describe(faults: list[dict[str, Any]]) -> str:
    """The faults as the console says them; a jump with the numbers it was judged by."""
    return "; ".join(f"{f['fault']} on rank(s) {', '.join(map(str, f['ranks']))}"
                     + (f" (loss {f['loss']:.4g}, typical {f['typical']:.4g}, spread {f['spread']:.3g}"
                        + (f"; gradient norm {f['norm']:.4g}, typical {f['norm_typical']:.4g}" if "norm" in f else "")
                        + ")" if f["fault"] == JUMP else "") for f in faults)


def _from_rows(rows: list[list[float]], engine_overflow: bool = False) -> list[dict[str, Any]]:
    faults = []
    for name, slot, _, _ in _BY_SLOT:
        values = {rank: row[slot] for rank, row in enumerate(rows) if _present(row, slot) and _faulty(slot, row[slot])
                  and not (slot == wire.GRAD_NORM and _overflow(row, engine_overflow))}
        if values:
            faults.append({"fault": name, "ranks": sorted(values), "values": values})
    return faults


def _overflow(row: list[float], engine_overflow: bool = False) -> bool:
    """A non-finite gradient norm under a dynamic loss scaler (the rank sends its scale) beside a finite
    loss: the scaler skips that step and lowers its scale (torch.amp's GradScaler, Lightning's 16-mixed).
    The scaler's business: the step is let through to it, never held, never counted against the budget.
    Under a DeepSpeed gate (`engine_overflow`) the same beside a finite loss, scale or not: the engine's own
    overflow check skips the step."""
    bits = row[wire.PRESENT]
    return bits == bits and (engine_overflow or bool(int(bits) & wire.HAS_SCALE)) and math.isfinite(row[wire.RAW_LOSS])


def _present(row: list[float], slot: int) -> bool:
    bits = row[wire.PRESENT]
    return bits == bits and bool(int(bits) & _BITS[slot])


def _faulty(slot: int, value: float) -> bool:
    return value == 0.0 if slot == wire.MIN_LABELS else not math.isfinite(value)


def _from_summary(seen: summary.Summary | None, engine_overflow: bool = False) -> list[dict[str, Any]]:
    """A step read from the summary alone (no rank showed anything there, or it would have been gathered):
    the same test on the counts, for the record without ranks."""
    if seen is None:
        return []
    faults = []
    # overflows: the scaler's (or the DeepSpeed engine's own check's)
    scaled = (engine_overflow or seen.has(wire.LOSS_SCALE)) and seen.nonfinite[wire.RAW_LOSS] == 0
    for name, slot, _, _ in _BY_SLOT:
        count = seen.zeros[slot] if slot == wire.MIN_LABELS else seen.nonfinite[slot]
        if count > 0 and not (slot == wire.GRAD_NORM and scaled):
            faults.append({"fault": name, "ranks": [], "values": {}})
    return faults


def _peak(rows: list[list[float]] | None, seen: summary.Summary | None, slot: int = wire.RAW_LOSS) -> float | None:
    """The step's highest finite loss (or `slot`'s value) over the ranks (None: none measured): from the
    rows, or the summary's max, which is the same number."""
    if rows is not None:
        values = [row[slot] for row in rows if _present(row, slot)]
        return max((value for value in values if math.isfinite(value)), default=None)
    if seen is None or not seen.has(slot):
        return None
    high = seen.high[slot]
    return high if math.isfinite(high) else None


def _measured(rows: list[list[float]] | None, seen: summary.Summary | None) -> bool:
    """Whether some rank measured a gradient norm before this step (a DeepSpeed gate's does not)."""
    if rows is not None:
        return any(_present(row, wire.GRAD_NORM) for row in rows)
    return seen is not None and seen.has(wire.GRAD_NORM)


def _jump(bound: tuple[float, float, float] | None, peak: float | None, rows: list[list[float]] | None,
          norm_bound: tuple[float, float, float] | None, norm: float | None, measured: bool) -> dict[str, Any] | None:
    """The jump fault, with what it was measured against (the user sees why), or None: a loss far above the
    run's AND, where a norm is measured, a finite norm far above the run's (a non-finite one is its own
    fault). From the summary the ranks are unknown: only the highest loss is."""
    if bound is None or peak is None or peak <= bound[2]:
        return None
    if measured and (norm_bound is None or norm is None or norm <= norm_bound[2]):
        return None  # a high loss with an ordinary update: data, not a fault
    typical, spread, limit = bound
    values = {} if rows is None else {rank: row[wire.RAW_LOSS] for rank, row in enumerate(rows)
                                      if _present(row, wire.RAW_LOSS) and row[wire.RAW_LOSS] > limit}
    fault = {"fault": JUMP, "ranks": sorted(values), "values": values, "loss": peak, "typical": typical,
             "spread": spread, "limit": limit}
    if measured:
        fault.update(norm=norm, norm_typical=norm_bound[0], norm_limit=norm_bound[2])
    return fault


def _drift(rows: list[list[float]]) -> dict[str, Any] | None:
    """The replicas whose finite fingerprint is off the one most ranks hold, or None. (Measured on the
    fingerprint schedule; above the world-size threshold differing fingerprints make the step gathered.)"""
    prints = {rank: row[wire.FINGERPRINT] for rank, row in enumerate(rows)
              if not wire.failed(row) and int(row[wire.PRESENT]) & wire.HAS_PRINT
              and math.isfinite(row[wire.FINGERPRINT])}
    if len(prints) < 2:
        return None
    values = list(prints.values())
    common = max(values, key=lambda v: (values.count(v), -min(r for r, x in prints.items() if x == v)))
    off = [r for r, v in prints.items() if abs(v - common) > DRIFT_TOLERANCE * max(abs(common), 1.0)]
    return {"fault": DRIFT, "ranks": off, "values": prints} if off else None
