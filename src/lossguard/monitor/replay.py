"""Replay to classify (`recover=True`, tier 2): what a held step was, and what is done with it.

When the commit gate holds a step (monitor/recover.py) and the loop gave `Guard.commit` its batch and a
`forward` closure (or `attach(engine, recover=True)` captured the engine's call: adapters/ds_replay.py), every rank (the gate's verdict is the same everywhere) runs one of two paths:

- **masked labels** (some rank's micro-batch has no supervised token): data by construction. The ranks
  whose micro-batch it is name all of its samples; no replay; the step stays held (that rank has no
  gradient to give).
- **otherwise, replay**: every rank drops its gradients, restores the RNG state its batch was handed out
  with (`Guard.batches`), recomputes the loss with `forward(batch)` and runs backward (DDP all-reduces as in
  the first attempt: every rank replays, or none does). One exchange (`gather_objects`) shares every
  rank's replayed loss and whether its gradients are finite (a step held for a loss jump faults again when
  some rank's replayed loss is still above the limit it was held at: monitor/jump.py). When some rank's
  loss is non-finite again, the ranks whose own loss is run a per-sample forward (no grad) to find the
  samples that produce it, and a second exchange shares them (both on the fault path only). Under ZeRO-3 a
  forward all-gathers parameters, so there every rank runs the same number of scan forwards
  (`Ops.symmetric_scan`). Every rank reads the same lists and decides the same:
  * nothing faults again: **transient**; the replay's gradients are committed. The RNG streams are where
    the first attempt left them (the replay drew the same numbers from the same state), so on CPU the run
    is bit-equal to one in which the fault never happened.
  * it faults again and some rank named some but not all of its samples: **sample**; they are quarantined
    (monitor/quarantine.py), every rank recomputes its loss from its handout RNG state on the samples kept
    and runs backward, and the step is committed.
  * a held jump that jumps again (the loss above the limit it was held at and, where the gate measured a
    norm, the replayed norm still far above the run's), every loss and gradient finite: the batch gives
    that update with these weights; **held** (the batch dropped; no per-sample scan: one healthy sample's loss may well sit above a
    limit set on the losses of whole batches, so it would name healthy samples).
  * it faults again and a rank's micro-batch is one sample, whose own loss faults again while some other
    rank's replayed loss is finite (the same weights give finite losses on other data): **sample**, that
    sample quarantined; the step is held (that rank has nothing left to learn from), and the sample is left
    out of every later epoch (monitor/quarantine.py: a batch left empty is skipped on every rank).
  * it faults again and no sample is named (the gradients, not the loss, are non-finite), every sample of
    a rank's batch of two or more fails, or every rank's does: the state is bad, not the data: **held**,
    as tier 1 (non-finite weights are rolled back before any replay when snapshots are on:
    monitor/snapshots.py).
"""

from __future__ import annotations

import contextlib
import math
import random
import sys
from collections.abc import Iterator
from typing import Any

import torch

from lossguard.monitor import dist, quarantine, tensors
from lossguard.monitor.recover import Hold, describe
from lossguard.monitor.sinks import say

ACTIONS = {
    "transient": "transient: replayed with the same RNG state on every rank, the fault did not come back; "
                 "the replay's gradients committed",
    "sample": "sample: replayed, the fault came back; the sample(s) named were quarantined, the rest of the "
              "batch recomputed and committed",
    "sample-dropped": "sample: replayed, the fault came back; the sample(s) named were quarantined, each the "
                      "whole micro-batch of its rank while the other ranks' samples were finite; the step held "
                      "(that rank has no sample left to learn from)",
    "sample-held": "sample: replayed, the fault came back; the sample(s) named were quarantined; recomputing "
                   "the rest of the batch failed on some rank (see the replay's errors): the step held",
    "failed": "held: the replay or the per-sample scan failed on some rank (see the replay's errors); every "
              "rank took the same path, none committed: the step held",
    "accumulated": "held: gradient accumulation, not replayed (a replay recomputes one micro-batch: committing "
                   "it alone would change the run); the step held",
    "masked": "sample: a micro-batch with every label masked, quarantined without a replay; the step held",
    "held": "held: replayed, the fault came back and no sample accounts for it (every sample of a batch fails, "
            "or the gradients do): the state is bad, not the data; the step held",
    "jump": "held: replayed, the loss jumped far above the run's spread again; the batch dropped, the step held",
}


def capture_rng() -> dict[str, Any]:
    """Every RNG a step may draw from: torch CPU (and CUDA where it is initialised), Python, numpy where
    imported. Host-side state only: no device sync."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        state["numpy"] = numpy.random.get_state()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        sys.modules["numpy"].random.set_state(state["numpy"])


class Ops:
    """What a replay does to the training state; this one: a plain PyTorch / DDP model (`Guard`). The
    DeepSpeed engine's are in adapters/ds_replay.py."""

    # True: every rank runs the same number of forwards in the per-sample scan (ZeRO-3 all-gathers the
    # parameters in each forward: a rank that scanned alone would wait there for the others)
    symmetric_scan = False
    scan: Any = None  # the per-sample scan's forward, where it differs from the replay's (the Trainer's)

    def __init__(self, model: Any) -> None:
        self.model = model

    def drop(self) -> None:
        """Drop the gradients in place (as `zero_grad()` does)."""
        for param in self.model.parameters():
            param.grad = None

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def grads_ok(self) -> bool:
        norm = self.norm()
        return norm is None or math.isfinite(norm)

    def norm(self) -> float | None:
        """The gradients' norm, as the gate measured it (None: no gradient). SYNC POINT: fault path only."""
        norm = tensors.grad_norm(p for p in self.model.parameters() if p.requires_grad)
        return None if norm is None else float(norm)

    @contextlib.contextmanager
    def scanning(self) -> Iterator[None]:
        """DDP would sync its buffers before a forward (a collective this rank alone would make): off."""
        sync = getattr(self.model, "require_forward_param_sync", None)
        if sync is not None:
            self.model.require_forward_param_sync = False
        try:
            yield
        finally:
            if sync is not None:
                self.model.require_forward_param_sync = sync


class Replayer:
    def __init__(self, monitor: Any, model: Any, held_quarantine: quarantine.Quarantine,
                 ops: Ops | None = None, defer_jump: bool = False, refused: str | None = None) -> None:
        self.monitor = monitor
        # why this rank cannot replay the step (gradient accumulation: monitor/guard.py); it says so in the
        # replay's exchange, and every rank then holds the step without a backward
        self.refused = refused
        self.ops = ops if ops is not None else Ops(model)
        self.quarantine = held_quarantine
        # with snapshots on, a jump that comes back is the state's fault: the caller rolls back (and records
        # it); `outcome` says so ("jump"), the held-jump record is then left to `record_jump`
        self.defer_jump = defer_jump
        self.outcome: str | None = None
        self._jump: tuple | None = None
        # gradients are in place (the first attempt's, or a replay's backward): what `drop` has to drop. A
        # replay whose ranks agreed to skip the backward has none (under DeepSpeed a drop is an engine
        # step, which fails with no gradient to skip)
        self.dirty = True

    def drop(self, always: bool = False) -> None:
        if self.dirty or always:
            self.ops.drop()
            self.dirty = False

    def classify(self, hold: Hold, batch: Any, forward: Any, rng: dict[str, Any] | None) -> bool:
        """Every rank together: True when the step is to be applied (the gradients in place are the
        replay's, or the kept samples'), False when it stays held (the gradients dropped)."""
        rank = self.monitor.rank
        masked = next((f["ranks"] for f in hold.faults if f["fault"].startswith("all labels masked")), None)
        if masked:
            mine = quarantine.identities(batch, list(range(quarantine.num_samples(batch))), step=hold.step,
                                         rank=rank, why="all labels masked") if rank in masked else []
            named = [e for part in dist.gather_objects(mine) for e in part]  # SYNC POINT: fault path only
            self.quarantine.add(named, write=rank == 0)
            self._record(hold, "masked", named, masked, {})
            self.drop()
            return False
        after = capture_rng()
        rows = dist.gather_objects(self._replay(hold, batch, forward, rng))  # SYNC POINT: fault path only
        again = [r for r, row in enumerate(rows) if not (row["loss_ok"] and row["grads_ok"])]
        replay = {"losses": {r: row["loss"] for r, row in enumerate(rows)}, "faulted_again": again}
        errors = {r: row["error"] for r, row in enumerate(rows) if row["error"]}
        if errors:  # the replay itself failed there: said, so a `held` is not read as the data's fault
            replay["errors"] = errors
        if not again:
            self._record(hold, "transient", [], origin(hold), replay,
                         self.monitor.gate.suspects(hold.step, origin(hold)))
            return True
        named, emptied, whole, failed = [], [], False, any(row["error"] for row in rows)
        # the scan names non-finite samples only (a jump's loss is finite: one healthy sample may sit above a
        # limit set on whole batches)
        scanners = [r for r, row in enumerate(rows) if not math.isfinite(row["loss"]) and row["size"]]
        if scanners and not failed:  # the ranks whose own loss faults again name their samples
            count = max(rows[r]["size"] for r in scanners) if self.ops.symmetric_scan else None
            found = dist.gather_objects(self._scan(hold, batch, forward, rank in scanners, count))  # SYNC POINT
            named = [e for part in found for e in part["bad"]]
            emptied = [r for r, part in enumerate(found) if part["bad"] and len(part["bad"]) == rows[r]["size"]]
            whole = any(not _alone(r, rows) for r in emptied)
            failed = any(part["error"] for part in found)
        if not named or whole or failed:
            jumped = not named and not failed and all(math.isfinite(row["loss"]) and row["grads_ok"] for row in rows)
            how = "jump" if jumped and hold.jump_limit is not None else "failed" if failed else "held"
            how = "accumulated" if any(row.get("refused") for row in rows) else how
            self.outcome = how
            if how == "jump" and self.defer_jump:
                self._jump = (hold, replay)
            else:
                self._record(hold, how, named, origin(hold), replay)
            self.drop()
            restore_rng(after)  # the scan drew from the RNG: leave it as the first attempt did
            return False
        self.quarantine.add(named, write=rank == 0)
        if emptied:  # some rank has no sample left to learn from: the step is held, the batch dropped
            self.outcome = "sample-dropped"
            self._record(hold, "sample-dropped", named, sorted({e["rank"] for e in named}), replay)
            self.drop()
            restore_rng(after)
            return False
        errors = self._recompute(batch, forward, rng, [e["position"] for e in named if e["rank"] == rank])
        if errors:  # the samples stay quarantined; the rest of the batch is not committed half-computed
            self.outcome = "sample-held"
            self._record(hold, "sample-held", named, sorted({e["rank"] for e in named}),
                         {**replay, "errors": {**replay.get("errors", {}), **errors}})
            self.drop()
            return False
        self._record(hold, "sample", named, sorted({e["rank"] for e in named}), replay)
        return True

    def record_jump(self) -> None:
        """The held jump's record, when the rollback it was deferred to did not happen (no snapshot)."""
        if self._jump is not None:
            hold, replay = self._jump
            self._record(hold, "jump", [], origin(hold), replay)
            self._jump = None

    def _replay(self, hold: Hold, batch: Any, forward: Any, rng: dict[str, Any] | None) -> dict[str, Any]:
        """This rank's replay. An error here is carried to the other ranks in the row, never raised: they
        wait for this rank in the exchange."""
        row = {"loss": float("nan"), "loss_ok": False, "grads_ok": False, "size": 0, "error": None}
        loss = None
        if self.refused:  # no forward here: the others skip their backward too, every rank holds
            row["error"], row["refused"] = self.refused, True
        else:
            try:
                self.drop(always=True)
                if rng is not None:
                    restore_rng(rng)
                loss = forward(batch)
            except Exception as exc:  # an OOM in the replay's forward, on this rank alone
                row["error"] = f"{type(exc).__name__}: {exc}"
        if self.agree(row["error"]):  # some rank has no loss: no rank enters the backward's all-reduce
            return row
        try:
            self.dirty = True
            self.ops.backward(loss)
            row["loss"] = float(loss.detach())  # SYNC POINT: fault path only
            # a held jump faults again when the replayed loss is still above the limit it was held at and
            # (where the gate measured a norm) the replayed update is still abnormal: a high loss with an
            # ordinary update is the batch's data, committed
            limit, norm_limit = hold.jump_limit, hold.norm_limit
            jumped = limit is not None and row["loss"] > limit
            norm = self.ops.norm() if jumped and norm_limit is not None and hasattr(self.ops, "norm") else None
            if norm is not None and math.isfinite(norm) and norm <= norm_limit:
                jumped = False
            row["loss_ok"] = math.isfinite(row["loss"]) and not jumped
            row["grads_ok"] = self.ops.grads_ok() if norm is None else math.isfinite(norm)
            row["size"] = quarantine.num_samples(batch)
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"
        return row

    def _scan(self, hold: Hold, batch: Any, forward: Any, mine: bool, count: int | None) -> dict[str, Any]:
        """The positions whose own loss is non-finite, named: one forward per sample, no grad, on the ranks
        whose replay faulted; with `count` (a symmetric scan) every rank runs that many forwards, a rank
        with fewer samples (or none to name) repeating its first, and only a scanning rank reads them."""
        part: dict[str, Any] = {"bad": [], "error": None}
        try:
            size = quarantine.num_samples(batch)
            total = count if count is not None else (size if mine else 0)
            bad = []
            with self.ops.scanning(), torch.no_grad():
                for p in range(total):
                    loss = (self.ops.scan or forward)(quarantine.select(batch, [p if p < size else 0]))
                    if mine and p < size and not math.isfinite(float(loss)):
                        bad.append(p)
            part["bad"] = quarantine.identities(batch, bad, step=hold.step, rank=self.monitor.rank,
                                                why="non-finite loss on replay")
        except Exception as exc:
            part["error"] = f"{type(exc).__name__}: {exc}"
        return part

    def agree(self, error: str | None) -> dict[int, str]:
        """Every rank's error at this point, {rank: error} (empty: none failed): gathered BEFORE a step that
        makes a collective (the backward's all-reduce), so that a rank which failed short of it and the
        ranks which did not take the same path: every rank runs that step, or none does. A rank that
        raised alone and skipped the collective would leave the others waiting in it until the process
        group's timeout. SYNC POINT: fault path only."""
        return {r: e for r, e in enumerate(dist.gather_objects(error)) if e}

    def _recompute(self, batch: Any, forward: Any, rng: dict[str, Any] | None, bad: list[int]) -> dict[int, str]:
        """Every rank: the loss of its kept samples (all of them on a rank that named none) from its handout
        RNG state, and its backward (DDP all-reduces: every rank runs it, or, when some rank's forward
        failed, none does). {rank: error}: empty when every rank's gradients are in place."""
        loss, error = None, None
        try:
            self.drop(always=True)
            if rng is not None:
                restore_rng(rng)
            kept = [p for p in range(quarantine.num_samples(batch)) if p not in set(bad)]
            loss = forward(quarantine.select(batch, kept) if bad else batch)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        errors = self.agree(error)
        if not errors:
            self.dirty = True
            self.ops.backward(loss)
        return errors

    def _record(self, hold: Hold, how: str, named: list[dict], ranks: list[int], replay: dict,
                suspects: dict[int, int] | None = None) -> None:
        kind = {"masked": "sample", "sample-held": "sample", "sample-dropped": "sample", "jump": "held",
                "failed": "held", "accumulated": "held"}.get(how, how)
        window = self.monitor.gate.options.window
        suspect = (f"; rank(s) {', '.join(f'{r} ({n} times)' for r, n in suspects.items())} faulted transiently "
                   f"within {window} steps, each time clean when replayed: a suspect device (check that GPU's "
                   "health, e.g. its ECC error counts, or move the job off it)") if suspects else ""
        event = {**self.monitor.gate.event(hold), "kind": kind, "ranks": ranks,
                 "samples": named, "steps_lost": 1 if how != "transient" and how != "sample" else 0,
                 "action": ACTIONS[how] + suspect}
        if suspects:
            event["suspects"] = sorted(suspects)
        if replay:
            event["replay"] = replay
        self.monitor.gate.note(event)
        if self.monitor.jsonl is not None:
            self.monitor.jsonl.write(event)
        if self.monitor.rank == 0 and self.monitor.options.console:
            say(console_line(hold, how, named, self.monitor.gate.options) + suspect)


def _alone(rank: int, rows: list[dict[str, Any]]) -> bool:
    """Whether `rank`'s batch, every sample of which faulted again, is one sample that faulted alone: a
    micro-batch of one on this rank while some other rank's replayed loss, from the same weights, is
    finite. Then the sample is at fault, not the state. Every sample of a larger batch failing, or every
    rank failing, points at the state (a bad weight row, not one bad sample)."""
    return rows[rank]["size"] == 1 and any(math.isfinite(row["loss"]) for other, row in enumerate(rows)
                                           if other != rank and row["size"])


def origin(hold: Hold) -> list[int]:
    """The ranks the fault started on: those whose own loss was non-finite (under DDP every rank's gradients
    are then non-finite too, the all-reduce averaged them in); else every rank the gate named."""
    for fault in hold.faults:
        if fault["fault"] == "non-finite loss" and fault["ranks"]:
            return sorted(fault["ranks"])
    return hold.ranks


def console_line(hold: Hold, how: str, named: list[dict], options: Any) -> str:
    what = describe(hold.faults)
    who = ", ".join(f"rank {e['rank']} position {e['position']} hash {e['hash']}"
                    + (f" index {e['index']}" if e["index"] is not None else "") for e in named)
    told = {"transient": "transient (the replay did not fault): the replay committed",
            "sample": f"reproducible: quarantined {who}; the rest of the batch committed",
            "sample-held": f"reproducible: quarantined {who}; recomputing the rest failed on some rank: the step held",
            "sample-dropped": f"reproducible: quarantined {who}, a micro-batch of one whose loss alone faulted "
                              "while the other ranks' were finite; the step held",
            "failed": "the replay failed on some rank (its error is in the events file): the step held on every rank",
            "accumulated": "not replayed under gradient accumulation: the step held",
            "masked": f"no supervised token: quarantined {who} without a replay; the step held",
            "held": "reproducible and no sample accounts for it (bad state, not data): the step held",
            "jump": "reproducible: the loss jumped again on replay; the batch dropped, the step held"}[how]
    return (f"lossguard: recovered at step {hold.step}: {what} ({hold.code}, {hold.signature}); {told}; "
            f"{hold.used} of {options.budget} recoveries within {options.window} steps used")
