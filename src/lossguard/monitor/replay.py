"""Replay to classify (`recover=True`, tier 2): what a held step was, and what is done with it.

When the commit gate holds a step (monitor/recover.py) and the loop gave `Guard.commit` its batch and a
`forward` closure, every rank (the gate's verdict is the same everywhere) runs one of two paths:

- **masked labels** (some rank's micro-batch has no supervised token): data by construction. The ranks
  whose micro-batch it is name all of its samples; no replay; the step stays held (that rank has no
  gradient to give).
- **otherwise, replay**: every rank drops its gradients, restores the RNG state its batch was handed out
  with (`Guard.batches`), recomputes the loss with `forward(batch)` and runs backward (DDP all-reduces as in
  the first attempt: every rank replays, or none does). A rank whose replayed loss is non-finite then runs a
  per-sample forward (no grad, no collective) to find the samples that produce it. One exchange
  (`gather_objects`) shares every rank's replayed loss, whether its gradients are finite, and its bad
  samples; every rank reads the same list and decides the same (a step held for a loss jump faults again
  when some rank's replayed loss is still above the limit it was held at: monitor/jump.py):
  * nothing faults again: **transient**; the replay's gradients are committed. The RNG streams are where
    the first attempt left them (the replay drew the same numbers from the same state), so on CPU the run
    is bit-equal to one in which the fault never happened.
  * it faults again and some rank named some but not all of its samples: **sample**; they are quarantined
    (monitor/quarantine.py), every rank recomputes its loss from its handout RNG state on the samples kept
    and runs backward, and the step is committed.
  * a held jump that jumps again, every loss and gradient finite: the batch gives that loss with these
    weights; **held** (the batch dropped; no per-sample scan: one healthy sample's loss may well sit above a
    limit set on the losses of whole batches, so it would name healthy samples).
  * it faults again and no sample is named (the gradients, not the loss, are non-finite) or every sample
    of a rank's batch fails: the state is bad, not the data: **held**, as tier 1 (non-finite weights are rolled back
    before any replay when snapshots are on: monitor/snapshots.py).
"""

from __future__ import annotations

import math
import random
import sys
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
    "masked": "sample: a micro-batch with every label masked, quarantined without a replay; the step held",
    "held": "held: replayed, the fault came back and no sample accounts for it (every sample fails, or the "
            "gradients do): the state is bad, not the data; the step held",
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


def _drop_grads(model: Any) -> None:
    for param in model.parameters():
        param.grad = None


def _bad_samples(batch: Any, forward: Any, model: Any) -> list[int]:
    """Positions whose own loss is non-finite: one forward per sample, no grad. DDP would sync its buffers
    before a forward (a collective this rank alone would make): that is switched off for the scan."""
    sync = getattr(model, "require_forward_param_sync", None)
    if sync is not None:
        model.require_forward_param_sync = False
    try:
        with torch.no_grad():
            return [p for p in range(quarantine.num_samples(batch))
                    if not math.isfinite(float(forward(quarantine.select(batch, [p]))))]
    finally:
        if sync is not None:
            model.require_forward_param_sync = sync


class Replayer:
    def __init__(self, monitor: Any, model: Any, held_quarantine: quarantine.Quarantine) -> None:
        self.monitor = monitor
        self.model = model
        self.quarantine = held_quarantine

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
            _drop_grads(self.model)
            return False
        after = capture_rng()
        rows = dist.gather_objects(self._replay(hold, batch, forward, rng))  # SYNC POINT: fault path only
        again = [r for r, row in enumerate(rows) if not (row["loss_ok"] and row["grads_ok"])]
        replay = {"losses": {r: row["loss"] for r, row in enumerate(rows)}, "faulted_again": again}
        if not again:
            self._record(hold, "transient", [], origin(hold), replay)
            return True
        named = [e for row in rows for e in row["bad"]]
        whole = any(row["bad"] and len(row["bad"]) == row["size"] for row in rows)
        if not named or whole or any(row["error"] for row in rows):
            jumped = not named and all(math.isfinite(row["loss"]) and row["grads_ok"] for row in rows)
            self._record(hold, "jump" if jumped and hold.jump_limit is not None else "held", named, origin(hold),
                         replay)
            _drop_grads(self.model)
            restore_rng(after)  # the scan drew from the RNG: leave it as the first attempt did
            return False
        self.quarantine.add(named, write=rank == 0)
        self._recompute(batch, forward, rng, [e["position"] for e in named if e["rank"] == rank])
        self._record(hold, "sample", named, sorted({e["rank"] for e in named}), replay)
        return True

    def _replay(self, hold: Hold, batch: Any, forward: Any, rng: dict[str, Any] | None) -> dict[str, Any]:
        """This rank's replay and, when its loss faults again, its per-sample scan. An error here is carried
        to the other ranks in the row, never raised: they wait for this rank in the exchange."""
        row = {"loss": float("nan"), "loss_ok": False, "grads_ok": False, "bad": [], "size": 0, "error": None}
        try:
            _drop_grads(self.model)
            if rng is not None:
                restore_rng(rng)
            loss = forward(batch)
            loss.backward()
            norm = tensors.grad_norm(p for p in self.model.parameters() if p.requires_grad)
            row["loss"] = float(loss.detach())  # SYNC POINT: fault path only
            # a held jump faults again when the replayed loss is still above the limit it was held at
            limit = hold.jump_limit
            row["loss_ok"] = math.isfinite(row["loss"]) and (limit is None or row["loss"] <= limit)
            row["grads_ok"] = norm is None or math.isfinite(float(norm))
            row["size"] = quarantine.num_samples(batch)
            if not math.isfinite(row["loss"]) and row["size"]:  # the scan names non-finite samples only
                positions = _bad_samples(batch, forward, self.model)
                row["bad"] = quarantine.identities(batch, positions, step=hold.step, rank=self.monitor.rank,
                                                   why="non-finite loss on replay")
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"
        return row

    def _recompute(self, batch: Any, forward: Any, rng: dict[str, Any] | None, bad: list[int]) -> None:
        """Every rank: the loss of its kept samples (all of them on a rank that named none) from its handout
        RNG state, and its backward (DDP all-reduces: every rank runs it)."""
        _drop_grads(self.model)
        if rng is not None:
            restore_rng(rng)
        kept = [p for p in range(quarantine.num_samples(batch)) if p not in set(bad)]
        forward(quarantine.select(batch, kept) if bad else batch).backward()

    def _record(self, hold: Hold, how: str, named: list[dict], ranks: list[int], replay: dict) -> None:
        kind = {"masked": "sample", "jump": "held"}.get(how, how)
        event = {**self.monitor.gate.event(hold), "kind": kind, "ranks": ranks,
                 "samples": named, "steps_lost": 1 if how in ("held", "masked", "jump") else 0,
                 "action": ACTIONS[how]}
        if replay:
            event["replay"] = replay
        if self.monitor.jsonl is not None:
            self.monitor.jsonl.write(event)
        if self.monitor.rank == 0 and self.monitor.options.console:
            say(console_line(hold, how, named, self.monitor.gate.options))


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
            "masked": f"no supervised token: quarantined {who} without a replay; the step held",
            "held": "reproducible and no sample accounts for it (bad state, not data): the step held",
            "jump": "reproducible: the loss jumped again on replay; the batch dropped, the step held"}[how]
    return (f"lossguard: recovered at step {hold.step}: {what} ({hold.code}, {hold.signature}); {told}; "
            f"{hold.used} of {options.budget} recoveries within {options.window} steps used")
