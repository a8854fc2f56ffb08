"""`Monitor`: the machinery shared by the three entry points.

Per optimizer step each rank builds one fixed-length float64 vector of its own signals, all ranks
gather it (the one collective per step, `dist.gather_rows`), and every rank feeds ALL ranks' records,
in rank order, into its own `Engine`. The findings, and so the halt decision, are therefore the same
on every rank at the same step. Local failures travel in the vector too (the `error` slot), so the
ranks also agree on when to stop analysing: the collective path never diverges.
"""

from __future__ import annotations

import math
import os
import traceback
from typing import Any

import torch

from lossguard.core.engine import Engine
from lossguard.core.findings import Finding
from lossguard.core.records import Record, event
from lossguard.detectors import make_detectors
from lossguard.monitor import dist, tensors
from lossguard.monitor.options import GuardOptions, halt_rules, should_halt
from lossguard.monitor.sinks import (
    JsonlSink,
    Webhook,
    at_least,
    finding_line,
    format_finding,
    record_line,
    say,
)

# Slots of the per-rank vector, then `num_lr` learning rates, then one update ratio per module group.
RAW_LOSS, LABELS, MIN_LABELS, GRAD_NORM, LOSS_SCALE, SKIPPED, FINGERPRINT, ERROR, PRESENT = range(9)
NUM_BASE = 9
# Bits of the PRESENT slot: which optional signals this rank measured at this step.
HAS_LOSS, HAS_LABELS, HAS_GRAD_NORM, HAS_SCALE, HAS_SKIPPED, HAS_PRINT, HAS_UPDATE, HAS_LR = (1 << i for i in range(8))

# Testing aid: "STEP:RANK" makes that rank's collection raise once at that step; "STEP:RANK:snapshot" makes
# its parameter snapshot for the next step raise instead (work after the halt decision).
INJECT_ERROR_ENV = "LOSSGUARD_INJECT_INTERNAL_ERROR"


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
        self.halted_at: int | None = None
        self.disabled = False  # agreed by every rank: analysis off, no more collectives
        self._local_error: str | None = None
        self._error_reported = False
        self._first_step_done = False
        self._closed = False
        self._micro: list[tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]] = []
        trainable = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        self._trainable = trainable
        self.groups, assign = tensors.assign_groups(trainable, options.module_groups)
        self.updates = tensors.UpdateSampler(trainable, self.groups, assign, options.update_sample_size)
        self.grad_watch = tensors.GradWatch(trainable)
        self.num_lr = len(getattr(optimizer, "param_groups", None) or []) or 1
        self.vector_len = NUM_BASE + self.num_lr + len(self.groups)
        self._inject = _parse_inject(os.environ.get(INJECT_ERROR_ENV))
        self.jsonl = None
        self.webhook = None
        self._emitted: list[Finding] = []
        self._last_skipped: dict[int, float] = {}
        self.facts = {"world_size": self.world_size, **(facts or {})}
        if options.events_dir is not None:
            self.jsonl = JsonlSink(options.events_dir, self.rank, {"world_size": self.world_size, "entry": entry})
        if options.webhook_url and self.rank == 0:
            self.webhook = Webhook(options.webhook_url)
        self._emit_records([event("facts", None, None, **self.facts)])
        if self._scheduled(1):
            self.updates.snapshot()

    # -- per micro-batch -------------------------------------------------------------------------
    def observe_micro(self, loss: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                      num_items: Any = None) -> None:
        """One forward/backward's loss (before any filter) and labels. No host sync."""
        if self.disabled or self._local_error:
            return
        try:
            tokens = tensors.supervised_tokens(labels) if labels is not None else None
            if loss is not None:
                loss = loss.detach().reshape(()).to(torch.float64)
                if num_items is not None and tokens is not None:
                    # sum-reduced loss over num_items: back to a per-token sum for this micro-batch
                    loss = loss * torch.as_tensor(num_items, dtype=torch.float64, device=loss.device)
                    weight = tokens.to(torch.float64)
                else:
                    weight = None
            else:
                weight = None
            self._micro.append((loss, tokens, weight))
        except Exception as exc:
            self._fail(exc, "observe_micro")

    # -- per optimizer step ----------------------------------------------------------------------
    def end_step(self, step: int, *, grad_norm: Any = None, lrs: list[float] | None = None,
                 loss_scale: Any = None, skipped_steps: Any = None) -> bool:
        """Gather every rank's signals for `step`, run the detectors; True when the run must halt."""
        if self.disabled or self._closed:
            return False
        micro, self._micro = self._micro, []
        first = not self._first_step_done
        self._first_step_done = True
        events = self._first_step_events() if first else None
        if first:
            # SYNC POINT (first step only): the parameter-name lists of every rank.
            gathered_events = dist.gather_objects(events)
        vector = self._local_vector(step, micro, grad_norm, lrs, loss_scale, skipped_steps)
        try:
            rows = dist.gather_rows(vector)  # SYNC POINT: the one collective + host copy per step
        except Exception as exc:  # the process group itself failed: nothing left to agree with
            self._fail(exc, "gather", raise_ok=False)
            self._disable(step, [self.rank])
            return False
        failed = [(r, row) for r, row in enumerate(rows) if row[ERROR]]
        if failed:
            self._disable(step, [r for r, _ in failed])
            return False
        # The halt decision depends only on the gathered rows, the same on every rank. Work that can fail on
        # one rank alone (the next step's parameter snapshot, out of memory) comes after it and cannot
        # change it: a rank that decided differently would train on while the others wait in a collective.
        hits: list[Finding] = []
        try:
            records: list[Record] = []
            if first:
                for rank_events in gathered_events:
                    records.extend(rank_events or [])
            records.extend(self._records(step, rows))
            hits = should_halt(self.rules, self._emit_records(records))
        except Exception as exc:
            self._fail(exc, "analysis")
        if self._scheduled(step + 1):
            try:
                if self._inject == (step, self.rank, "snapshot"):
                    self._inject = None
                    raise MemoryError(f"injected snapshot failure ({INJECT_ERROR_ENV})")
                self.updates.snapshot()
            except Exception as exc:
                self._fail(exc, "update snapshot")
        if hits and self.halted_at is None:
            self.halted_at = step
            self._announce_halt(step, hits)
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
            self.jsonl.write({"type": "end", "halted_at": self.halted_at, "disabled": self.disabled})
            self.jsonl.close()
        if self.webhook is not None:
            self.webhook.close()
        return new

    # -- internals -------------------------------------------------------------------------------
    def _scheduled(self, step: int) -> bool:
        every = self.options.fingerprint_every
        return every > 0 and (step == 1 or step % every == 0)

    def _first_step_events(self) -> list[Record] | None:
        try:
            out = []
            in_opt = tensors.optimizer_params(self.optimizer) if self.optimizer is not None else None
            if in_opt is not None:
                ids = {id(p) for p in in_opt}
                missing = [n for n, p in self.model.named_parameters() if p.requires_grad and id(p) not in ids]
                if missing:
                    out.append(event("trainable-not-in-optimizer", 1, self.rank, params=missing[:50],
                                     count=len(missing)))
            no_grad = self.grad_watch.no_grad()
            if no_grad:
                out.append(event("no-grad", 1, self.rank, params=no_grad[:50], count=len(no_grad),
                                 num_trainable=len(self._trainable)))
            return out
        except Exception as exc:
            self._fail(exc, "first-step checks")
            return None

    def _local_vector(self, step, micro, grad_norm, lrs, loss_scale, skipped) -> torch.Tensor:
        try:
            if self._local_error:
                raise _Reported()
            if self._inject == (step, self.rank, "collection"):
                self._inject = None
                raise RuntimeError(f"injected internal error ({INJECT_ERROR_ENV})")
            return self._build_vector(step, micro, grad_norm, lrs, loss_scale, skipped)
        except Exception as exc:
            if not isinstance(exc, _Reported):
                self._fail(exc, "collection", raise_ok=False)
            vector = torch.full((self.vector_len,), math.nan, dtype=torch.float64, device=self.device)
            vector[ERROR] = 1.0
            if self.options.raise_errors and not isinstance(exc, _Reported):
                raise
            return vector

    def _build_vector(self, step, micro, grad_norm, lrs, loss_scale, skipped) -> torch.Tensor:
        slots: list[Any] = [math.nan] * self.vector_len
        present = 0
        losses = [(loss, w) for loss, _, w in micro if loss is not None]
        if losses:
            if all(w is not None for _, w in losses):
                total = torch.stack([loss.to(self.device) for loss, _ in losses]).sum()
                weight = torch.stack([w.to(self.device) for _, w in losses]).sum()
                slots[RAW_LOSS] = torch.where(weight > 0, total / weight.clamp_min(1.0), total)
            else:
                slots[RAW_LOSS] = torch.stack([loss.to(self.device) for loss, _ in losses]).mean()
            present |= HAS_LOSS
        counts = [tok for _, tok, _ in micro if tok is not None]
        if counts:
            stacked = torch.stack([c.to(self.device) for c in counts])
            slots[LABELS], slots[MIN_LABELS] = stacked.sum(), stacked.min()
            present |= HAS_LABELS
        for slot, bit, value in ((GRAD_NORM, HAS_GRAD_NORM, grad_norm), (LOSS_SCALE, HAS_SCALE, loss_scale),
                                 (SKIPPED, HAS_SKIPPED, skipped)):
            if value is not None:
                slots[slot] = value
                present |= bit
        if lrs:
            for i, lr in enumerate(lrs[: self.num_lr]):
                slots[NUM_BASE + i] = lr
            present |= HAS_LR
        if self._scheduled(step):
            print_ = tensors.fingerprint(self.model)
            if print_ is not None:  # None: ZeRO-3, no replicas to compare
                slots[FINGERPRINT] = print_
                present |= HAS_PRINT
            ratios = self.updates.ratios()
            if ratios is not None:
                for i, ratio in enumerate(ratios):
                    slots[NUM_BASE + self.num_lr + i] = ratio
                present |= HAS_UPDATE
        slots[ERROR] = 0.0
        slots[PRESENT] = float(present)
        return torch.stack([torch.as_tensor(v, dtype=torch.float64).to(self.device).reshape(()) for v in slots])

    def _records(self, step: int, rows: list[list[float]]) -> list[Record]:
        records = []
        last_skipped = self._last_skipped
        for rank, row in enumerate(rows):
            present = int(row[PRESENT])
            signals: dict[str, float] = {}
            data: dict[str, Any] = {}
            if present & HAS_LOSS:
                signals["raw_loss"] = signals["loss"] = row[RAW_LOSS]
            if present & HAS_LABELS:
                signals["num_label_tokens"], signals["min_label_tokens"] = row[LABELS], row[MIN_LABELS]
            if present & HAS_GRAD_NORM:
                signals["grad_norm"] = row[GRAD_NORM]
            if present & HAS_SCALE:
                signals["loss_scale"] = row[LOSS_SCALE]
            if present & HAS_SKIPPED:
                signals["skipped_steps"] = row[SKIPPED]
                if row[SKIPPED] > last_skipped.get(rank, 0.0) and "grad_norm" in signals:
                    # the optimizer skipped this step (fp16 overflow, bf16 check_grad_overflow): the
                    # grad_norm DeepSpeed reports now is its overflow marker (inf, or the last good
                    # value), not a measurement; keep it out of the signals
                    data["step_skipped"] = True
                    data["grad_norm_reported"] = signals.pop("grad_norm")
                last_skipped[rank] = row[SKIPPED]
            if present & HAS_LR:
                lrs = row[NUM_BASE: NUM_BASE + self.num_lr]
                signals["lr"] = lrs[0]
                data["lr_groups"] = lrs
            if present & HAS_PRINT:
                signals["param_fingerprint"] = row[FINGERPRINT]
            if present & HAS_UPDATE:
                ratios = row[NUM_BASE + self.num_lr:]
                finite = [r for r in ratios if math.isfinite(r)]
                signals["update_ratio"] = max(finite) if finite else math.nan
                data["update_ratio_groups"] = dict(zip(self.groups, ratios))
            records.append(Record(step=step, rank=rank, signals=signals, data=data, source="live"))
        return records

    def _emit_records(self, records: list[Record]) -> list[Finding]:
        new: list[Finding] = []
        for record in records:
            if record.source == "":
                record.source = "live"
            if self.jsonl is not None and (record.rank is None or record.rank == self.rank):
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

    def _announce_halt(self, step: int, hits: list[Finding]) -> None:
        codes = ", ".join(sorted({f"{f.code} ({f.signature or f.name})" for f in hits}))
        text = f"lossguard: halting at step {step} on every rank: {codes}"
        if self.jsonl is not None:
            self.jsonl.write({"type": "halt", "step": step, "codes": [f.code for f in hits]})
        if self.rank == 0:
            say(text)
            if self.webhook is not None:
                self.webhook.send(text)

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


def _parse_inject(text: str | None) -> tuple[int, int, str] | None:
    if not text:
        return None
    step, _, rest = text.partition(":")
    rank, _, phase = rest.partition(":")
    return int(step), int(rank or 0), phase or "collection"
