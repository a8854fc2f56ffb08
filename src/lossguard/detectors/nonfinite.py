"""Non-finite values: shown (`nan` / `inf` in the log) or hidden (the Trainer's NaN filter prints 0.0;
DeepSpeed's grad-norm sentinels). KNOWLEDGE.md §0.1, §0.4, §0.6."""

from __future__ import annotations

import math
from dataclasses import dataclass

from lossguard.core.column_tests import absent, finite, finite_nonzero
from lossguard.core.findings import Finding, Severity
from lossguard.core.records import EVAL, EVENT, TRAIN, Record
from lossguard.detectors._base import DetectorBase, PerRank, is_nonfinite, is_rl, no_sentinel, sentinel_index
from lossguard.detectors.registry import register

# Consecutive exact-zero logs after a normal loss that prove the filter artefact on their own.
_ZERO_STREAK = 3
# A finite loss at least this large before the zeros: a real decay to ~0 passes through small values.
_NORMAL_LOSS = 0.05
# Non-finite grad norms in a row that are no longer "maybe a skipped step".
_PERSISTENT = 3
# A loss this many times the previous one, next to a non-finite norm: the step blew up, it was not skipped.
_JUMP = 10.0
# LOSS002's: a finite non-zero loss (no raw loss); while a run of zeros is open, no record with a loss.
_ZEROS_SPARED = {"loss": finite_nonzero, "raw_loss": absent}
_ZEROS_OPEN = {"loss": absent, "raw_loss": absent}
# GRAD001's: no sentinel; while a run of one is open, no grad norm.
_NO_SENTINEL = {"grad_norm": no_sentinel}
_EVERY_GRAD = {"grad_norm": absent}
# LOSS001's `spared_when`: nothing non-finite and no zero loss; while a norm waits, no grad norm at all.
_SPARED = {"raw_loss": finite, "loss": finite_nonzero, "eval_loss": finite, "grad_norm": finite}
_WAITING = {**_SPARED, "grad_norm": absent}


@register
class NonFiniteLoss(DetectorBase):
    """LOSS001: loss, eval loss or gradient norm is NaN/Inf in the log (or in the live raw loss).

    A skipped step is not a death: fp16 loss scaling (and bf16 `check_grad_overflow`) drop the step
    and the weights stay finite, so those are left to SCALE001. A non-finite grad norm next to a
    finite, non-zero loss may be such a skip in a log without OVERFLOW lines, but only while it is
    isolated: it counts as a death when the next log shows the weights died (loss 0.0 or NaN), when
    it persists while the LR schedule moves on (three logs in a row), or when the loss beside it
    jumped by an order of magnitude. Logs whose learning rate is still 0, or frozen where a moving schedule
    was, are what skipping looks like and do not count as persistent (a constant schedule tells nothing).
    An isolated non-finite norm in a log that never shows skipping (no fp16, no OVERFLOW line, no LR held
    by a skip) is reported at the end, as a warning: such a log is never healthy."""

    wants = frozenset({"raw_loss", "loss", "eval_loss", "grad_norm", "overflow", "facts"})
    spared_when_changes = True  # while a non-finite norm waits for the next log (`spared_when`)
    code = "LOSS001"
    name = "loss.nonfinite"
    signature = "nonfinite"
    severity = Severity.CRITICAL

    def __init__(self) -> None:
        super().__init__()
        self._fp16_skip_until: int | None = None  # an fp16 overflow skip explains an inf grad norm
        # rank -> [step, grad, count, frozen LR]: non-finite norms next to a finite loss, waiting for the next
        # log
        self._pending: dict[int | None, list] = {}
        self._may_skip = True  # unless the facts rule it out, an inf norm may be a skipped fp16 step
        # Non-finite norms let pass as possible skips although the log shows no sign of skipping (the LR moved
        # on): [first step, value, rank, how many]. A log holding such a value is never healthy: `finish`
        # warns about them if nothing fired.
        self._let_pass: list | None = None
        self._skips_seen = False  # the log shows skipping (fp16, OVERFLOW lines, an LR held by skips)

    @property
    def spared_when(self) -> dict:
        """Nothing non-finite and no zero loss (what would confirm a pending non-finite norm): nothing to
        judge; while a norm is pending, no record with a grad norm either (a finite one ends the wait)."""
        return _WAITING if self._pending else _SPARED

    def observe(self, record: Record) -> list[Finding]:
        if record.kind == EVENT:
            if record.event == "overflow" and record.step is not None:
                self._fp16_skip_until = record.step + 1
                self._skips_seen = True
            elif record.event == "facts" and record.data.get("bf16") and not record.data.get("fp16") and \
                    record.data.get("check_grad_overflow") is not True:
                # bf16 without check_grad_overflow never skips: a non-finite norm is fatal at once.
                self._may_skip = False
            elif record.event == "facts" and record.data.get("fp16"):
                self._skips_seen = True
            return []
        skipped = record.data.get("step_skipped") or self._skipped_here(record)
        for name in ("raw_loss", "loss", "eval_loss"):
            value = record.signals.get(name)
            if is_nonfinite(value) and not (skipped and record.kind == TRAIN):
                where = "evaluation loss" if record.kind == EVAL else name.replace("_", " ")
                return self._fire(record, f"{where} is {value}", name, value)
        if record.kind != TRAIN:
            return []
        grad, loss = record.signals.get("grad_norm"), record.signals.get("loss")
        pending = self._pending.get(record.rank)
        if is_nonfinite(grad) and not skipped:
            if loss is not None and loss != 0.0 and self._may_skip:
                return self._maybe_skipped(record, grad, loss, pending)
            beside = "" if pending is None or loss is None else f" beside a loss of {loss}"
            return self._fire(record, f"gradient norm is {grad}{beside}", "grad_norm", grad)
        if pending is not None and loss is not None and (loss == 0.0 or is_nonfinite(loss)):
            return self._fire(record, f"the loss is {loss}", "grad_norm", pending[1])
        if pending is not None and grad is not None and not is_nonfinite(grad):
            del self._pending[record.rank]  # a finite norm: the wait is over
        return []

    def _maybe_skipped(self, record: Record, grad: float, loss: float, pending: list | None) -> list[Finding]:
        """A non-finite norm next to a live loss: maybe an fp16 skip, unless it persists, the loss blew up or
        the log's own skip counter says the step was applied."""
        if self._applied_here(record):
            return self._fire(record, f"gradient norm is {grad} on a step the log counts as applied (its skipped-"
                                      f"step count did not move): the non-finite update reached the weights",
                              "grad_norm", grad, loss_finite=1)
        before = self.counts.previous(record.rank, "loss")
        if before is not None and 0.0 < before < math.inf and not is_nonfinite(loss) and loss >= _JUMP * before:
            return self._fire(record, f"the step blew up: the loss jumped from {before:g} to {loss:g} with a "
                                      f"gradient norm of {grad}", "grad_norm", grad, loss_exploded=1)
        lr = record.signals.get("lr")
        if pending is None:
            # The LR a skip would freeze: only where the schedule was moving before (a constant schedule
            # repeats its LR whether or not steps are skipped, so it tells nothing).
            lr_before, lr_earlier = self.counts.previous(record.rank, "lr"), self.counts.earlier(record.rank, "lr")
            moving = lr_earlier is not None and lr_before != lr_earlier
            frozen = lr if lr is not None and lr == lr_before and moving else None
            pending = self._pending[record.rank] = [record.step, grad, 0, frozen]
        # A skipped step does not step the scheduler: a log whose LR is still 0, or frozen where a moving
        # schedule was, is what skipping looks like (transformers 5 + DeepSpeed print no OVERFLOW line for
        # it). Other logs count towards "persistent", and are warned about at the end if they stay isolated.
        moved = lr is None or (lr != 0.0 and lr != pending[3])
        if not moved:
            self._skips_seen = True
        else:
            if self._let_pass is None:
                self._let_pass = [record.step, grad, record.rank, 0]
            self._let_pass[3] += 1
        pending[2] += moved
        if pending[2] >= _PERSISTENT:
            return self._fire(record, f"gradient norm is {pending[1]} in {pending[2]} logs in a row from step "
                                      f"{pending[0]}: not an isolated skipped step", "grad_norm", pending[1],
                              complete=True)
        return []  # maybe an fp16 skip (a streak of them while the scale calibrates): wait for the next log

    def finish(self) -> list[Finding]:
        super().finish()
        if self.fired is not None or self._let_pass is None or self._skips_seen:
            return []
        step, grad, rank, count = self._let_pass
        return self.emit(
            f"gradient norm is {grad} at step {step} ({count} log(s) with a non-finite norm beside a finite "
            "loss, none followed by a dead loss): a skipped fp16 step would look like this, but this log shows "
            "no skipping (no OVERFLOW line, no loss-scale drop, the LR moved on). Check the run's skipped-step "
            "count; under bf16 without check_grad_overflow such a step makes the weights NaN", step, rank,
            severity=Severity.WARNING, signal="grad_norm", value=str(grad), on_eval=0, loss_finite=1)

    def _fire(self, record: Record, what: str, signal: str, value: float, *, complete: bool = False,
              **data) -> list[Finding]:
        """The finding, at the onset: the step of a pending non-finite norm this record confirms, else the
        record's. `what` says what this record shows, without a step; the message names the onset step
        only (`complete`: `what` is the whole message and names it already)."""
        pending = self._pending.pop(record.rank, None)
        step = pending[0] if pending is not None else record.step
        if complete:
            message = what
        elif pending is not None and pending[0] != record.step:
            message = f"gradient norm is {pending[1]} at step {step}, then {what} in a later log"
        else:
            message = f"{what} at step {step}"
        data.update(signal=signal, value=str(value), on_eval=int(signal == "eval_loss"))
        # Which went non-finite first: the gradient beside a finite loss (the forward pass was fine, the
        # fault is in backward or the gradient reduction) or the loss itself (the forward pass). A loss
        # that blew up beside the norm is neither: the update before it already went wrong.
        if data.get("loss_exploded"):
            pass
        elif pending is not None:
            data["loss_finite"] = 1
        elif signal == "grad_norm" and (loss := record.signals.get("loss")) not in (None, 0.0):
            # (A loss of 0.0 beside it is the NaN filter's, or masked labels: it tells neither way.)
            data["loss_finite"] = int(not is_nonfinite(loss))
        elif signal in ("loss", "raw_loss") and self.counts.seq(record.rank, "grad_norm"):
            data["loss_finite"] = 0  # only where the log shows grad norms: else which came first is unknown
        return self.emit(message, step, record.rank, **data)

    def _applied_here(self, record: Record) -> bool:
        """The record carries the run's skipped-step count (Megatron's `number of skipped iterations`,
        DeepSpeed's `skipped=`) and it did not grow: this log's steps were applied, none skipped."""
        skipped = record.signals.get("skipped_steps")
        if skipped is None:
            return False
        before = self.counts.previous(record.rank, "skipped_steps")
        return skipped == (before if before is not None else 0.0)

    def _skipped_here(self, record: Record) -> bool:
        # fp16: DeepSpeed skips the step and lowers the scale; the scale detector judges storms.
        return self._fp16_skip_until is not None and record.step is not None and \
            record.step <= self._fp16_skip_until


@dataclass
class _ZeroState:
    last_finite: float | None = None
    zero_since: int | None = None
    zero_streak: int = 0
    lr_frozen: bool = False  # the first zero came with the LR of the log before: a skipped step
    raw_at: int | None = None  # the loss count (SignalCounts.seq) of the latest record with a raw loss


@register
class HiddenNonFinite(DetectorBase):
    """LOSS002: loss printed as exactly 0.0 after a normal loss: the Trainer's `logging_nan_inf_filter`
    turned a NaN window into 0.0. Confirmed at once by a NaN/sentinel grad norm or a NaN eval loss,
    else by a streak of exact zeros."""

    wants = frozenset({"loss", "eval_loss"})
    spared_when_changes = True  # while a run of zeros is open (`spared_when`)
    code = "LOSS002"
    name = "loss.nan-filter-zero"
    signature = "nonfinite-hidden"
    severity = Severity.CRITICAL

    def __init__(self) -> None:
        super().__init__()
        self._state = PerRank(_ZeroState)
        self._open: set[int | None] = set()  # ranks with a run of zeros open

    @property
    def spared_when(self) -> dict:
        """A finite, non-zero loss (no raw loss: those are rare) only becomes the last finite loss, which
        `observe` reads from the engine's counts at the next record it sees; while a run of zeros is open,
        every loss (the first finite one ends the run)."""
        return _ZEROS_OPEN if self._open else _ZEROS_SPARED

    def observe(self, record: Record) -> list[Finding]:
        if record.kind == EVAL and is_nonfinite(record.signals.get("eval_loss")):
            for rank, state in self._state.items():
                if state.zero_since is not None:
                    return self._fire(state, rank, "eval_loss is NaN while the training loss shows 0.0")
            return []
        loss = record.signals.get("loss")
        if record.kind != TRAIN or loss is None:
            return []
        state = self._state[record.rank]
        seq = self.counts.seq(record.rank, "loss")
        # The loss logged before this one, when the engine spared it us: the latest finite loss.
        before = self.counts.previous(record.rank, "loss")
        if before is not None and before != 0.0 and not is_nonfinite(before) and seq - 1 != state.raw_at:
            state.last_finite = before
        if record.signals.get("raw_loss") is not None:
            state.raw_at = seq
            return []  # live records carry the raw loss (LOSS001 sees the NaN)
        if loss != 0.0:
            if is_nonfinite(loss):
                return []
            state.last_finite, state.zero_since, state.zero_streak = loss, None, 0
            self._open.discard(record.rank)
            return []
        if is_rl(record):
            return []  # an RL trainer's loss (GRPO's beta x KL) is legitimately 0.0
        if state.last_finite is None or state.last_finite < _NORMAL_LOSS:
            return []  # zero from the first log, or after a smooth decay: other detectors judge
        if state.zero_since is None:
            state.zero_since = record.step
            self._open.add(record.rank)
            lr = record.signals.get("lr")
            state.lr_frozen = lr is not None and lr != 0.0 and lr == self.counts.previous(record.rank, "lr")
        state.zero_streak += 1
        grad = record.signals.get("grad_norm")
        if is_nonfinite(grad):
            return self._fire(state, record.rank, f"grad_norm is {grad} next to it")
        if (k := sentinel_index(grad)) is not None:
            return self._fire(state, record.rank, f"grad_norm {grad} is DeepSpeed's sqrt({k}) sentinel "
                                                  "for non-finite gradients", sentinel_groups=k)
        if state.zero_streak >= _ZERO_STREAK:
            return self._fire(state, record.rank, f"{state.zero_streak} logs in a row are exactly 0.0")
        return []

    def finish(self) -> list[Finding]:
        super().finish()
        for rank, state in list(self._state.items()):
            if self.fired is None and state.zero_since is not None:
                # Too few zeros to prove the filter artefact, but no loss falls from a normal value to
                # exactly 0 in one log by learning: dead either way, which kind the log cannot tell.
                return self.emit(
                    f"loss went from {state.last_finite:g} to exactly 0.0 at step {state.zero_since} "
                    f"({state.zero_streak} log(s) at 0.0): no loss falls to exactly 0 in one log by learning. "
                    "Either the loss is NaN and the Trainer's filter prints 0.0, or every label is masked; "
                    "log grad_norm and eval_loss (or set logging_nan_inf_filter=False) to tell which",
                    state.zero_since, rank, severity=Severity.ERROR, signature="zero-loss",
                    previous_loss=state.last_finite, lr_frozen=int(state.lr_frozen))
        return []

    def _fire(self, state: _ZeroState, rank: int | None, why: str, **data) -> list[Finding]:
        if self.fired is not None:
            return self.again()
        return self.emit(
            f"loss went from {state.last_finite:g} to exactly 0.0 at step {state.zero_since}: the Trainer's "
            f"NaN filter hides non-finite losses as 0.0 ({why}); the weights are most likely NaN",
            state.zero_since, rank, previous_loss=state.last_finite, evidence=why,
            lr_frozen=int(state.lr_frozen), **data)


@dataclass
class _SentinelState:
    value: float | None = None
    streak: int = 0
    since: int | None = None
    first_loss: float | None = None  # the loss logged with the first norm of the run
    loss_moved: bool = False  # the loss changed during the run: the weights are alive


@register
class GradNormSentinel(DetectorBase):
    """GRAD001: grad_norm pinned at sqrt(k) (1.0, 1.4142135..., 1.7320508...): DeepSpeed's sentinel for
    non-finite gradients in ZeRO-1/2 (-1 per param group)."""

    wants = frozenset({"grad_norm"})
    spared_when_changes = True  # while a run of sentinels is open, every grad norm: a non-sentinel ends it
    code = "GRAD001"
    name = "grad.sentinel"
    signature = "nonfinite-hidden"
    severity = Severity.CRITICAL
    _STREAK = 3

    def __init__(self) -> None:
        super().__init__()
        self._state = PerRank(_SentinelState)
        self._open: set[int | None] = set()  # ranks with a run of sentinels open

    @property
    def spared_when(self) -> dict:
        return _EVERY_GRAD if self._open else _NO_SENTINEL

    def observe(self, record: Record) -> list[Finding]:
        grad = record.signals.get("grad_norm")
        if record.kind != TRAIN or grad is None:
            return []
        state = self._state[record.rank]
        k = self._track(state, record.step, grad)
        if state.streak:
            self._open.add(record.rank)
        else:
            self._open.discard(record.rank)
        loss = record.signals.get("loss")
        if k is not None:
            self._follow_loss(state, loss)
        if k is not None and self._pinned(state, loss, is_rl(record)):
            return self.emit(
                f"grad_norm is {grad} (sqrt({k})) from step {state.since}: DeepSpeed reports sqrt(number of "
                f"param groups) when the gradients are NaN/Inf", state.since, record.rank,
                value=grad, groups=k)
        return []

    @staticmethod
    def _track(state: _SentinelState, step: int | None, grad: float) -> int | None:
        """Follow the run of one sentinel value; k when `grad` is sqrt(k), else None (the run ends)."""
        k = sentinel_index(grad)
        if k is None:
            state.value, state.streak, state.since = None, 0, None
        elif state.value == grad:
            state.streak += 1
        else:
            state.value, state.streak, state.since = grad, 1, step
        return k

    @staticmethod
    def _follow_loss(state: _SentinelState, loss: float | None) -> None:
        if state.streak == 1:
            state.first_loss, state.loss_moved = loss, False
        elif loss is not None and state.first_loss is not None and loss != state.first_loss:
            state.loss_moved = True

    def _pinned(self, state: _SentinelState, loss: float | None, rl: bool) -> bool:
        """Pinned at a sentinel while the loss is dead (0.0 / NaN), or log after log with a loss that does not
        move. A norm of exactly 1.0 beside a loss that keeps changing is one reported after clipping to
        max_grad_norm=1.0: the weights are alive, so it is not the non-finite sentinel. An RL loss of 0.0 is
        not dead (GRPO's loss is beta * KL, 0 at the start), and transformers 5 prints a norm of 0.99996 as
        '1': one such log beside it proves nothing."""
        if (loss == 0.0 and not rl) or is_nonfinite(loss):
            return state.streak >= 1
        return state.streak >= self._STREAK and not state.loss_moved


@register
class OtherLossNonFinite(DetectorBase):
    """LOSS011: a second loss column of a log is NaN/Inf while the loss the reader chose is finite (Lightning's
    progress-bar `loss=nan` beside NeMo's `reduced_train_loss=3.91`, `lm_loss` beside `loss`). Readers keep such
    a value as `other_loss` (sources/vocabulary.put_loss) so that no choice of column hides a NaN. A warning, not a
    death: the finite column and a finite gradient norm say the weights are alive, and the NaN may be a
    display slot the integration does not fill; if it is a component of the trained loss, the gradient norm
    or the loss turns non-finite next and LOSS001 reports that. Fix: find which loss is NaN and why (log the
    components; `torch.autograd.set_detect_anomaly` on a few steps)."""

    wants = frozenset({"other_loss"})
    spared_when = {"other_loss": finite}
    code = "LOSS011"
    name = "loss.other-column-nonfinite"
    signature = "nonfinite"
    severity = Severity.WARNING

    def observe(self, record: Record) -> list[Finding]:
        other, loss = record.signals.get("other_loss"), record.signals.get("loss")
        if record.kind != TRAIN or not is_nonfinite(other) or is_nonfinite(loss):
            return []  # a non-finite chosen loss is LOSS001's
        return self.emit(f"a second loss column is {other} at step {record.step} while the loss read is {loss:g}: "
                         "one of the losses this run logs is not finite", record.step, record.rank, value=other)
