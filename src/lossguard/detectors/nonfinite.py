"""Non-finite values shown in the log (`nan` / `inf`); the hidden ones (the Trainer's NaN filter prints 0.0,
DeepSpeed's grad-norm sentinels) are nonfinite_hidden.py's. bf16 ZeRO applies a NaN step (known issue
bf16-no-overflow-check); fp16 skips it."""

from __future__ import annotations

import math

from lossguard.core.column_tests import absent, finite, finite_nonzero
from lossguard.core.findings import Finding, Severity
from lossguard.core.records import EVAL, EVENT, TRAIN, Record
from lossguard.detectors._base import DetectorBase, is_nonfinite
from lossguard.detectors.registry import register

# Non-finite grad norms in a row that are no longer "maybe a skipped step".
_PERSISTENT = 3
# A loss this many times the previous one, next to a non-finite norm: the step blew up, it was not skipped.
_JUMP = 10.0
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
    by a skip) is reported at the end, as a warning: such a log is never healthy.

    Checked against the columns after it: NaN weights never compute a finite loss again. When the last
    three logs or more after the last non-finite value (or NaN-filter 0.0) show a finite, non-zero loss that
    moves (and was never negative, which no working cross-entropy is) and a finite gradient norm, the step was skipped or the value never reached the weights (a
    transient fp16 overflow, a skip the log does not name): a warning, not a dead run. A NaN evaluation loss
    is not judged this way (the weights the evaluation used may be fine while the evaluation overflows)."""

    predicts = {
        "loss": "NaN/Inf (or the NaN filter's 0.0) from the onset to the end: NaN weights never compute a "
                "finite loss again (finite, moving losses after it contradict it)",
        "grad_norm": "NaN/Inf from the onset, or a DeepSpeed sentinel",
        "lr": "moving on (a skipped step would hold it)",
        "eval_loss": "NaN after the onset",
        "loss_scale": "at its floor under fp16 (a storm), or absent",
    }
    demoted = Severity.WARNING  # a transient non-finite value is still worth a look

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
        self._last_bad: dict[int | None, int] = {}  # rank -> its loss count at its latest non-finite train log

    def contradiction(self) -> str | None:
        rank = self.fired.rank
        if self.fired.data.get("on_eval") or rank not in self._last_bad:
            return None
        num = self.counts.seq(rank, "loss") - self._last_bad[rank]
        last, before, grad = (self.counts.last(rank, "loss"), self.counts.previous(rank, "loss"),
                              self.counts.last(rank, "grad_norm"))
        if num < _PERSISTENT or last in (None, 0.0, before) or is_nonfinite(last) or is_nonfinite(grad):
            return None
        profile = self.profile.get(rank)
        if profile is not None and profile.minimum < 0.0:
            return None  # a loss below 0 is no cross-entropy a working model computes: it vouches for nothing
        return (f"the {num} logs after the last non-finite one show a finite loss that moves (last {last:g}) and "
                "a finite gradient norm: NaN weights never compute a finite loss again, so the weights survived "
                "(the step was skipped or the value never reached them)")

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
        if record.kind == TRAIN and _bad(record.signals):
            self._last_bad[record.rank] = self.counts.seq(record.rank, "loss")
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


def _bad(signals: dict) -> bool:
    """A train log with a non-finite value, or the NaN filter's 0.0."""
    loss = signals.get("loss")
    return loss == 0.0 or is_nonfinite(loss) or is_nonfinite(signals.get("grad_norm")) or \
        is_nonfinite(signals.get("raw_loss"))
