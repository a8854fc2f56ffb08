"""`Monitor`: the machinery shared by the three entry points.

Per optimizer step each rank builds one fixed-length float64 vector of its own signals (`wire`). Up to
`detail_every_step_up_to` ranks, all ranks gather it (`dist.gather_rows`) and every rank feeds ALL ranks'
records, in rank order, into its own `Engine`. Above it, the ranks all-reduce a summary of the vectors
(`dist.reduce_summary`, monitor/summary.py) and feed one run-level record; they gather the rows only on the
steps the summary (or the schedule: the first step, fingerprint steps, the steps just after a finding's
cause) says to look at rank by rank. Either way the records, and so the findings and the halt decision,
are the same on every rank at the same step, and so is the choice of collectives. Local failures travel in
the vector too (the `error` slot), so the ranks agree on when to stop analysing: the path never diverges.
"""

from __future__ import annotations

import os
import traceback
from typing import Any

import torch

from lossguard.core.engine import Engine
from lossguard.core.findings import Finding
from lossguard.core.records import TRAIN, Record, event
from lossguard.detectors import make_detectors
from lossguard.monitor import deferred, dist, first_step, settle, sharding, summary, tensors, wire
from lossguard.monitor.exchange import Exchange
from lossguard.monitor.options import GuardOptions, halt_rules, should_halt
from lossguard.monitor.recover import Gate, Hold
from lossguard.monitor.sinks import (
    JsonlSink,
    Webhook,
    announce_halt,
    at_least,
    finding_line,
    format_finding,
    record_line,
    say,
    tell_unreadable,
)


class Monitor:
    def __init__(self, options: GuardOptions, model: torch.nn.Module, optimizer: Any = None,
                 facts: dict[str, Any] | None = None, entry: str = "guard") -> None:
        self.options = options
        self.rank = dist.rank()
        self.world_size = dist.world_size()
        self.device = dist.comm_device()
        self.model = tensors.unwrap_model(model)
        self.optimizer = optimizer
        self.engine = Engine(make_detectors() if options.detectors is None else options.detectors)
        self.rules = halt_rules(options.halt_on)
        self.settling = settle.Settling(self.engine.detectors)  # halts that wait for a column to contradict them
        self.halted_at: int | None = None
        # recover=True: the commit gate (monitor/recover.py); `held`: its last decision (None: committed)
        self.gate = Gate(options.recovery) if options.recovery is not None else None
        self.held: Hold | None = None
        # set by the entry point when the quarantine left this rank's batch of the step empty (quarantine.py
        # `shed`): sent in the step's exchange, where every rank learns it and skips the step
        self.emptied = False
        # with recovery: decides snapshots at the first step from every rank's measurements (monitor/sizing.py)
        self.planner: Any = None
        self.lag = 0  # 1: steps end before the optimizer step (`Guard.commit`)
        # DeepSpeed + recover: post-step values wait for the next exchange (monitor/deferred.py)
        self.deferred = False
        self._pending: deferred.Pending | None = None
        self._post: dict[str, Any] = {}
        self.disabled = False  # agreed by every rank: analysis off, no more collectives
        self._local_error: str | None = None
        self._error_reported = False
        self._first_step_done = False
        self._closed = False
        self._micro: list[tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]] = []
        trainable = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        self._trainable = trainable
        self.sharded = sharding.Split(model, trainable, self.world_size)  # FSDP shards, the rest
        self.groups, assign = tensors.assign_groups(trainable, options.module_groups)
        self.updates = tensors.UpdateSampler(trainable, self.groups, assign, options.update_sample_size)
        # FSDP sets a shard's gradient after its reduce-scatter, not through autograd: no hook would fire there
        self.grad_watch = tensors.GradWatch([(n, p) for n, p in trainable if id(p) not in self.sharded.ids])
        num_lr = len(getattr(optimizer, "param_groups", None) or []) or 1
        self.layout = wire.Layout(num_lr=num_lr, groups=tuple(self.groups))
        self.jsonl = None
        self.webhook = None
        self._emitted: list[Finding] = []
        self._last_skipped: dict[int, float] = {}
        self._watched: dict[int, int] = {}  # above the threshold: rank -> the last step it stood out
        # Above the threshold a step is reduced, and gathered only when there is something to look at.
        self.exchange = Exchange(self.layout, self.world_size, options.detail_every_step_up_to)
        self.facts = {"world_size": self.world_size, **sharding.facts(model), **(facts or {})}
        if options.events_dir is not None:
            self.jsonl = JsonlSink(options.events_dir, self.rank, {"world_size": self.world_size, "entry": entry})
        if options.webhook_url and self.rank == 0:
            self.webhook = Webhook(options.webhook_url)
        self._emit_records([event("facts", None, None, **self.facts)])
        if self._scheduled(1):
            self.updates.snapshot()  # never raises: a parameter it cannot read is skipped (tensors.UpdateSampler)
        tell_unreadable(self.jsonl, self.rank, self.options.console, self.updates.unsaid())

    # -- per micro-batch -------------------------------------------------------------------------
    def observe_micro(self, loss: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                      num_items: Any = None, loss_items: torch.Tensor | None = None) -> None:
        """One forward/backward's loss (before any filter) and labels. No host sync.

        `num_items`: what the model divided a summed loss by (`num_items_in_batch`); `loss_items`: this
        micro-batch's share of it, counted as the caller counted `num_items` (default: its supervised
        tokens). The step's loss is then `Σ loss·num_items / Σ loss_items`: the per-token mean the
        Trainer logs."""
        if self.disabled or self._local_error:
            return
        try:
            tokens = tensors.supervised_tokens(labels) if labels is not None else None
            if loss is not None:
                if not isinstance(loss, torch.Tensor):  # a Python / numpy number: measured all the same
                    loss = torch.tensor(float(loss), dtype=torch.float64)
                loss = loss.detach().reshape(()).to(torch.float64)
                items = loss_items if loss_items is not None else tokens
                if num_items is not None and items is not None:
                    # sum-reduced loss over num_items: back to a per-token sum for this micro-batch
                    loss = loss * tensors.on_device_factor(num_items, loss.device)
                    weight = items.to(torch.float64)
                else:
                    weight = None
            else:
                weight = None
            self._micro.append((loss, tokens, weight))
        except Exception as exc:
            self._fail(exc, "observe_micro")

    # -- per optimizer step ----------------------------------------------------------------------
    def end_step(self, step: int, *, grad_norm: Any = None, lrs: list[float] | None = None,
                 loss_scale: Any = None, skipped_steps: Any = None, gating: bool = False) -> bool:
        """Gather every rank's signals for `step`, run the detectors; True when the run must halt. `gating`:
        before the optimizer step with recovery on, a faulty step is held (`self.held`) and not analysed."""
        self.held = None
        if self.disabled or self._closed:
            return False
        micro, self._micro = self._micro, []
        first = not self._first_step_done
        self._first_step_done = True
        events = self._first_step_events() if first else None
        if first:
            # SYNC POINT (first step only): the parameter-name lists of every rank, and with recovery each
            # rank's snapshot measurements (monitor/sizing.py), which every rank decides snapshots from alike.
            mine = self.planner.local() if self.planner is not None else None
            gathered = dist.gather_objects((events, mine, first_step.shard_grads(self.sharded)))
            gathered_events = [pair[0] for pair in gathered]  # + the shards no rank got a gradient for (FSDP):
            gathered_events.append(first_step.no_grad_shards(self.sharded, [t[2] for t in gathered], len(self._trainable)))
            if self.planner is not None:
                try:
                    self.planner.decided([pair[1] for pair in gathered])
                except Exception as exc:  # the same gathered list on every rank: fails alike, snapshots stay off
                    self._fail(exc, "snapshot plan")
        vector = self._local_vector(step, micro, grad_norm, lrs, loss_scale, skipped_steps)
        self.emptied = False
        try:
            rows, seen, own = self.exchange.step(step, first, vector)
        except Exception as exc:  # the process group itself failed: nothing left to agree with
            self._fail(exc, "gather", raise_ok=False)
            self._disable(step, [self.rank])
            return False
        failed = [r for r, row in enumerate(rows) if wire.failed(row)] if rows is not None else []
        if failed:
            self._disable(step, failed)
            return False
        # The halt decision depends only on the gathered rows (or the reduced summary), the same on every
        # rank. Work that can fail on one rank alone (the next step's parameter snapshot, out of memory)
        # comes after it and cannot change it: a rank that decided differently would train on while the
        # others wait in a collective.
        hits, hold = [], None  # the gate, as the halt, decides from the gathered numbers alone
        try:
            hold = self.gate.judge(step, rows, seen) if gating and self.gate is not None else None
            leading = [r for rank_events in gathered_events for r in (rank_events or [])] if first else []
            found = self._complete_pending()
            if hold is not None and not hold.give_up:
                self._hold(hold, leading)
            elif self.deferred and hold is None:  # analysed at the next exchange, with its post-step values
                self._pending = deferred.Pending(step, rows, seen, own, leading)
            else:  # committed, or the budget is spent: the step goes to the detectors as without recovery
                found += self.analyse_rows(step, rows, leading, seen) if rows is not None else \
                    self.analyse_summary(step, seen, own)
            hits, refuted = self.settling.due(should_halt(self.rules, found))
            settle.say_refuted(step, refuted, self.jsonl, self.rank == 0)
            hits = hits or (found if getattr(hold, "give_up", False) else [])
        except Exception as exc:
            self._fail(exc, "analysis")
        if self._measured(step + 1) and not self._measured(step):  # else `ratios` kept this step's sample
            try:
                self.updates.snapshot()
            except Exception as exc:
                self._fail(exc, "update snapshot")
        if (hits or getattr(hold, "give_up", False)) and self.halted_at is None:
            self.halted_at = step
            announce_halt(self, step, hits, hold)
            return True
        return False

    def close(self) -> list[Finding]:
        if self._closed:
            return []
        self._closed = True
        new: list[Finding] = []
        try:
            self.grad_watch.remove()
            if not self.disabled:
                self._complete_pending()
                result = self.engine.finish()
                known = {id(f) for f in self._emitted}
                new = [f for f in result.findings if id(f) not in known]
                self._publish(new)
        except Exception as exc:
            self._fail(exc, "finish")
        if self._local_error is not None and not self.disabled:
            # Failed after the last gather (or in `finish`): no later step will carry it to the other
            # ranks, so this rank reports it itself, once.
            if self.jsonl is not None:
                self.jsonl.write(record_line(event("internal-error", self.halted_at, self.rank, ranks=[self.rank],
                                                   detail=self._local_error)))
            say(f"lossguard: internal error on rank {self.rank} ({self._local_error}); the run's findings "
                f"stand. Please report this.")
        if self.jsonl is not None:
            self.jsonl.write({"type": "end", "halted_at": self.halted_at, "disabled": self.disabled,
                              "steps_by_path": self.steps_by_path})
            self.jsonl.close()
        if self.webhook is not None:
            self.webhook.close()
        return new

    @property
    def steps_by_path(self) -> dict[str, int]:
        """Steps that gathered every rank's row ("detail") and steps read from the summary alone."""
        return self.exchange.steps_by_path

    def after_step(self, **post: Any) -> None:
        """A deferred step's post-step values (`grad_norm`, `loss_scale`, `skipped_steps`), kept unread."""
        self._post = post

    # -- internals -------------------------------------------------------------------------------
    def _complete_pending(self) -> list[Finding]:
        pending, self._pending = self._pending, None
        if pending is None:  # post-step values of a step with no record (a committed replay) are dropped
            self._post = {}
            return []
        deferred.complete(pending, self._post, self.world_size)
        self._post = {}
        if pending.rows is not None:
            return self.analyse_rows(pending.step, pending.rows, pending.leading, pending.seen)
        return self.analyse_summary(pending.step, pending.seen, pending.own)

    def _scheduled(self, step: int) -> bool:
        every = self.options.fingerprint_every
        return every > 0 and (step == 1 or step % every == 0)

    def _measured(self, step: int) -> bool:
        """On schedule; `lag` steps later when steps end before the optimizer step (`Guard.commit`)."""
        return step > self.lag and self._scheduled(step - self.lag)

    def _hold(self, hold: Hold, leading: list[Record]) -> None:
        """A held step: its `recovery` line on every rank, said on rank 0; its rows reach no detector."""
        self.held = hold
        self._emit_records(leading)
        if hold.skip:  # a batch the quarantine left empty: no recovery, the entry point drops the gradients
            if self.jsonl is not None:
                self.jsonl.write(self.gate.skip_event(hold))
            if self.rank == 0 and self.options.console:
                say(self.gate.console_line(hold))
            return
        if self.gate.replay:  # a replay follows: monitor/replay.py records what the step turns out to be
            return
        if self.jsonl is not None:
            self.jsonl.write(self.gate.event(hold))
        if self.rank == 0 and self.options.console:
            say(self.gate.console_line(hold))

    def _first_step_events(self) -> list[Record] | None:
        try:
            return first_step.events(self.model, self.optimizer, self.grad_watch, len(self._trainable), self.rank)
        except Exception as exc:
            self._fail(exc, "first-step checks")
            return None

    def _local_vector(self, step, micro, grad_norm, lrs, loss_scale, skipped) -> torch.Tensor:
        try:
            if self._local_error:
                raise _Reported()
            values = self._step_values(step, micro, grad_norm, lrs, loss_scale, skipped)
            return self.layout.encode(values, self.device)
        except Exception as exc:
            if not isinstance(exc, _Reported):
                self._fail(exc, "collection", raise_ok=False)
            if self.options.raise_errors and not isinstance(exc, _Reported):
                raise
            return self.layout.error_vector(self.device)

    def _step_values(self, step, micro, grad_norm, lrs, loss_scale, skipped) -> wire.StepValues:
        """This rank's measurements, still on the device: nothing here waits for the host."""
        values = wire.StepValues(grad_norm=grad_norm, loss_scale=loss_scale, skipped_steps=skipped, lrs=lrs or [],
                                 emptied=self.emptied)
        values.grad_norm, values.grad_sq_shard = self.sharded.norm_slots(grad_norm)  # FSDP: folded in the exchange
        wire.put_micro(values, micro, self.device)
        if self._measured(step):
            values.param_fingerprint = tensors.fingerprint(self.model, self.sharded.ids)  # None: no replicas
            values.update_ratios = self.updates.ratios(keep=self._measured(step + 1))
            tell_unreadable(self.jsonl, self.rank, self.options.console, self.updates.unsaid())
        return values

    def analyse_summary(self, step: int, seen: summary.Summary, own: list[float] | None = None) -> list[Finding]:
        """A step read from the summary alone: the run-level record through the engine. This rank's own row
        still goes to its events file, so the file holds every step of the rank as below the threshold.
        The new findings. (`bench/scale.py` times `Summary.read` + `Exchange.note` + this.)"""
        if own is not None:
            self._write_own(step, summary.own_row(own, seen))
        return self._emit_records([summary.run_record(seen, step)])

    def _write_own(self, step: int, own: list[float]) -> None:
        """This rank's row of a step whose engine input leaves it out, to its events file. Decoded without
        `_row_record`'s skip bookkeeping: that state feeds every rank's engine alike and must move only with
        gathered rows (a summary-only step never moves the skip count anyway)."""
        if self.jsonl is not None:
            signals, data = self.layout.decode(own)
            self.jsonl.write(record_line(Record(step=step, rank=self.rank, signals=signals, data=data, source="live")))

    def analyse_rows(self, step: int, rows: list[list[float]], leading: list[Record] = (),
                     seen: summary.Summary | None = None) -> list[Finding]:
        """One gathered step, as every rank analyses it: `leading` records (the first step's events), then
        rank records in rank order, then (above the threshold) the run-level record of `seen`, through the
        engine: a fault is named by its rank before the run-level record can report it. Below the threshold
        every rank has its record; above it, only the ranks `_ranks_to_feed` picks, so a step gathered at
        thousands of ranks costs the detectors a few records. The new findings. (`bench/scale.py` times
        this at simulated world sizes.)"""
        if seen is None:
            return self._emit_records([*leading, *self._records(step, rows)])
        picked = summary.ranks_to_feed(self.layout, step, rows, seen, self._watched)
        if self.rank not in picked:
            self._write_own(step, rows[self.rank])
        ranked = [self._row_record(step, rank, rows[rank]) for rank in picked]
        for rank, row in enumerate(rows):  # the others' skip counts, for the next step one of them is fed
            if row[wire.SKIPPED] == row[wire.SKIPPED]:
                self._last_skipped[rank] = row[wire.SKIPPED]
        return self._emit_records([*leading, *ranked, summary.run_record(seen, step)])

    def _records(self, step: int, rows: list[list[float]]) -> list[Record]:
        return [self._row_record(step, rank, row) for rank, row in enumerate(rows)]

    def _row_record(self, step: int, rank: int, row: list[float]) -> Record:
        return wire.row_record(self.layout, step, rank, row, self._last_skipped)

    def _emit_records(self, records: list[Record]) -> list[Finding]:
        new: list[Finding] = []
        for record in records:
            if record.source == "":
                record.source = "live"
            # A rank writes its own records and the run's events; the run-level train record (above the
            # threshold) is not written: every rank's file holds that rank's own record of every step.
            mine = record.rank == self.rank or (record.rank is None and record.kind != TRAIN)
            if self.jsonl is not None and mine:
                self.jsonl.write(record_line(record))
            new.extend(self.engine.feed(record))
        self._publish(new)
        return new

    def _publish(self, findings: list[Finding]) -> None:
        self._emitted.extend(findings)
        for finding in findings:
            if self.jsonl is not None:
                self.jsonl.write(finding_line(finding))
            if self.rank == 0 and self.options.console and at_least(finding, self.options.console_min_severity):
                say(format_finding(finding))
            if self.webhook is not None and at_least(finding, self.options.webhook_min_severity):
                self.webhook.send(format_finding(finding))

    def _fail(self, exc: BaseException, where: str, raise_ok: bool = True) -> None:
        """A lossguard bug: remembered, reported once (all ranks agree at the next gather)."""
        if self._local_error is None:
            self._local_error = f"{where}: {type(exc).__name__}: {exc}"
            if os.environ.get("LOSSGUARD_DEBUG"):
                traceback.print_exc()
        if raise_ok and self.options.raise_errors:
            raise exc

    def _disable(self, step: int, ranks: list[int]) -> None:
        self.disabled = True
        self.grad_watch.remove()
        detail = self._local_error or "see that rank's events file"
        text = (f"lossguard: internal error on rank(s) {ranks} at step {step} ({detail}); live analysis is "
                f"off for the rest of this run, training continues. Please report this.")
        if self.jsonl is not None:
            self.jsonl.write(record_line(event("internal-error", step, self.rank, ranks=ranks,
                                               detail=self._local_error)))
        if self.rank == min(ranks):  # reported once, by the rank that knows the detail
            say(text)


class _Reported(Exception):
    """The local error was already recorded; only the error slot needs sending."""

