"""The learning rate skipped steps leave at 0 (LR001): DeepSpeed steps its scheduler only on applied steps, so
a run whose every step overflows keeps the LR where its warmup starts, often exactly 0; a warmup longer than
the run does the same. Beside SCALE001 (overflow.py), which reads the skips themselves.
"""

from __future__ import annotations

import math

from lossguard.core.column_tests import absent, nonzero
from lossguard.core.findings import Finding, Severity
from lossguard.core.records import EVENT, TRAIN, Record
from lossguard.detectors._base import DetectorBase, LossRun, Streak, is_nonfinite, printed_tolerance
from lossguard.detectors.overflow import LOWEST_INITIAL_SCALE
from lossguard.detectors.registry import register

# A non-zero LR ends a run of zeros: only the zeros are routed, and every LR while a run is open.
_LR_NONZERO, _EVERY_LR = {"lr": nonzero}, {"lr": absent}

# A start-up run of skipped steps at DeepSpeed's defaults (initial_scale_power 16, hysteresis 2: the first
# overflow only spends the hysteresis) has driven the scale under LOWEST_INITIAL_SCALE once it is longer than
# this: 16 - 7 halvings plus the one overflow the hysteresis absorbs. An LR still 0 after more steps than that
# is no calibration; one that rises within them was.
_DS_INITIAL_SCALE, _DS_HYSTERESIS = 2.0 ** 16, 2
MAX_CALIBRATION_STEPS = round(math.log2(_DS_INITIAL_SCALE / LOWEST_INITIAL_SCALE)) + _DS_HYSTERESIS - 1


@register
class LearningRateZero(DetectorBase):
    """LR001: learning rate 0 log after log: the scheduler is not stepping (fp16 skips, or warmup longer than
    the run), so the weights are not being updated.

    An LR that is 0 from the first logs and then rises is warmup, or DeepSpeed's start-up loss-scale
    calibration (the scheduler steps only on applied steps; the Trainer warns "tried to get lr value before
    scheduler/optimizer started stepping"): no finding. Such a start-up run counts only when it lasts to the
    end of the log (three logs or more), or when the log says no step was applied (that warning, or a grad
    norm of exactly 0.0: DeepSpeed's until its first applied step) for more real steps than the calibration
    takes (MAX_CALIBRATION_STEPS; with the warning the LR has been 0 since step 1, so one log at step 11
    shows 11 steps without an optimizer step). A run of zeros after the LR had moved counts at three logs."""

    wants = frozenset({"lr", "lr-before-step", "overflow"})
    predicts = {
        "lr": "exactly 0 and staying there; after it had moved, reached from a value its print could not "
              "round to 0 (an LR whose last value before the zeros is the smallest one its print shows, "
              "0.0001 at four decimals, may be a decaying LR printed as 0)",
        "loss": "no trend over the logs at LR 0: weights that are not updated do not learn (a loss that falls "
                "contradicts it; one that moves beside a rounded LR does too)",
        "grad_norm": "finite or 0.0 (DeepSpeed's before its first applied step); NaN on skipped steps",
        "loss_scale": "falling on skipped steps (fp16) or absent",
        "eval_loss": "flat",
    }
    code = "LR001"
    name = "lr.stuck-at-zero"
    signature = "lr-zero"
    severity = Severity.CRITICAL
    _STREAK = 3

    spared_when_changes = True  # while a run of zeros is open, every LR (a non-zero one ends it)

    def __init__(self) -> None:
        super().__init__()
        self._zero = Streak()  # zero-LR logs of the run-level log and rank 0, in a row
        self._warned_before_step = 0
        self._steps: set[int] = set()  # steps counted (a DeepSpeed `step=` line and an HF dict share one)
        self._overflow_steps: set[int] = set()
        self._num_zero_lr = 0  # zero-LR logs (rank 0 / the run's), counted or not
        self._startup = False  # the current run of zeros began with every LR log before it 0
        self._lr_before: float | None = None  # the LR logged just before the current run of zeros
        self._losses = LossRun()  # the losses logged over the current run of zeros
        self._fired_run: tuple[float | None, LossRun] | None = None  # those two for the run that fired

    def observe(self, record: Record) -> list[Finding]:
        if record.kind == EVENT and record.event == "lr-before-step":
            self._warned_before_step += 1
            return []
        if record.kind == EVENT and record.event == "overflow" and record.step is not None:
            self._overflow_steps.add(record.step)
            return []
        lr = record.signals.get("lr")
        if record.kind != TRAIN or lr is None or record.rank not in (None, 0):
            return []
        if lr != 0.0:
            self._zero.update(False, record.step)  # a non-zero LR ends the run of zeros
            return []
        # LR logs of the run-level log and rank 0 so far, the non-zero ones the engine spared us too.
        seq = self.counts.seq(None, "lr") + self.counts.seq(0, "lr")
        self._num_zero_lr += 1
        if record.step in self._steps or record.step in self._overflow_steps or self._skipped(record):
            return []  # a skipped step does not step the scheduler: neither a stuck LR nor the end of a run
        self._steps.add(record.step)
        if len(self._steps) > 4096:
            self._steps.clear()
        if self._zero.update(True, record.step) == 1:
            self._startup = self._num_zero_lr == seq  # no LR log so far was anything but 0
            self._lr_before = None if self._startup else self.counts.previous(record.rank, "lr")
            self._losses = LossRun()
        self._losses.add(record.signals.get("loss"))
        if not self._startup:
            return self._report() if self._zero.count >= self._STREAK else []
        # Only where the log says no step was applied since step 1: the Trainer's warning, or DeepSpeed's grad
        # norm still at the 0.0 it starts from (it is set on the first applied step). An LR printed as `0.0000`
        # beside a moving grad norm is a small LR rounded, not a scheduler that never stepped.
        unapplied = self._warned_before_step or record.signals.get("grad_norm") == 0.0
        steps = record.step if unapplied and not record.step_is_ordinal else None
        if steps is not None and steps > MAX_CALIBRATION_STEPS:
            return self._report(f"; {steps} steps without an optimizer step by step {record.step}, more than "
                                f"start-up loss-scale calibration takes ({MAX_CALIBRATION_STEPS} at DeepSpeed's "
                                "defaults)")
        return []

    @property
    def spared_when(self) -> dict:
        return _EVERY_LR if self._zero.count else _LR_NONZERO

    def _report(self, why: str = "") -> list[Finding]:
        if self._warned_before_step:
            why += f"; the Trainer warned {self._warned_before_step}x that the scheduler has not stepped"
        if self.fired is None:
            self._fired_run = (self._lr_before, self._losses)
        logs = f"{self._zero.count} logs in a row" if self._zero.count > 1 else "the log"
        return self.emit(f"learning rate is 0 in {logs} from step {self._zero.since}: the weights are not being "
                         f"updated{why}", self._zero.since)

    def finish(self) -> list[Finding]:
        # The run is still on: while it is open every LR log is routed here, and a non-zero one ends it.
        if self.fired is None and self._startup and self._zero.count >= self._STREAK:
            found = self._report("; it never rose from the start to the end of the log")
        else:
            found = []
        super().finish()
        return found

    def contradiction(self) -> str | None:
        if self._fired_run is None:
            return None
        before, losses = self._fired_run
        if (fell := losses.fell()) is not None:
            return (f"the loss falls from {fell[0]:.4g} to {fell[1]:.4g} over the {losses.num} logs at LR 0: the "
                    "weights are updated, so the logged LR is not the optimizer's (rounded by the print, or a "
                    "wrapper's)")
        if before is not None and _rounds_to_zero(before) and losses.moved():
            return (f"the LR just before the zeros was {before:g}, the smallest value its print shows: a "
                    "decaying LR under half of that prints as 0, and the loss moves meanwhile")
        return None

    def _skipped(self, record: Record) -> bool:
        """The step of this log was skipped: the skip counter grew, or (in a log without skip counters)
        the grad norm is non-finite next to a finite loss."""
        if record.data.get("step_skipped"):
            return True
        skipped = record.signals.get("skipped_steps")
        before = self.counts.previous(record.rank, "skipped_steps")
        if skipped is not None and before is not None and skipped > before:
            return True
        loss = record.signals.get("loss")
        return is_nonfinite(record.signals.get("grad_norm")) and loss is not None and loss != 0.0 \
            and not is_nonfinite(loss)


def _rounds_to_zero(lr: float) -> bool:
    """The LR is the smallest non-zero value of a fixed-decimal print (0.0001 at four decimals): the next
    lower value of a decaying LR may print as 0."""
    tolerance = printed_tolerance(lr)  # 1e-6 for a full float repr, which rounds nothing
    return tolerance > 1e-6 and 0 < lr <= 3 * tolerance
