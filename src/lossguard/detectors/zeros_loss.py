"""A loss of exactly 0 that nothing else explains: the bare `zero-loss` (no grad norm logged to tell masked
labels from a hidden NaN), and a zero loss beside a zero learning rate (no step ever applied)."""

from __future__ import annotations

import math

from lossguard.core.column_tests import absent, nonzero
from lossguard.core.findings import Finding, Severity
from lossguard.core.records import TRAIN, Record
from lossguard.detectors._base import DetectorBase, Streaks, is_rl
from lossguard.detectors.registry import register

_STREAK = 2  # two logs, not one: a single fp16 skip also logs loss 0.0
_LOSS_NONZERO, _EVERY_LOSS = {"loss": nonzero}, {"loss": absent}
# A log whose first step is later than this does not show where the loss started (LOSS004's and LOSS010's).
_FROM_START = 100


@register
class ZeroLoss(DetectorBase):
    """LOSS003: loss exactly 0 from the first logs and nothing else tells which kind (no grad_norm logged).
    Reported at the end so the more specific detectors speak first.

    Checked against the step column: every label masked, or a NaN hidden from the first batch, gives 0.0 from
    step 1; a log whose first step is past the start of training (a pasted tail, a resumed run) does not show
    where the zeros began, and a memorising run prints 0.0 there too (its loss rounded to four decimals).
    Then it is a warning: log grad_norm, or keep the log from step 1, to tell."""

    predicts = {
        "loss": "exactly 0.0 from the first step of training to the end (a log that begins after the start "
                "does not show it: a memorised model's rounded loss also prints 0.0)",
        "grad_norm": "absent (logged, it decides: 0 for masked labels (LABEL001), NaN or a sentinel for a "
                     "hidden NaN (LOSS002, GRAD001))",
        "lr": "anything",
        "eval_loss": "0.0 or NaN for the same reasons, or absent",
    }
    demoted = Severity.WARNING  # zeros that may be a memorised model's are still worth a look

    wants = frozenset({"loss"})
    spared_when_changes = True  # while a run of zeros is open, every loss
    code = "LOSS003"
    name = "loss.exact-zero"
    signature = "zero-loss"
    severity = Severity.ERROR

    def __init__(self) -> None:
        super().__init__()
        self._loss_zero = Streaks()
        self._from_first: set[int | None] = set()  # ranks whose run of zeros began with their first loss

    @property
    def spared_when(self) -> dict:
        return _EVERY_LOSS if self._loss_zero.open else _LOSS_NONZERO

    def observe(self, record: Record) -> list[Finding]:
        loss = record.signals.get("loss")
        if record.kind != TRAIN or loss is None:
            return []
        if is_rl(record):
            self._loss_zero.end(record.rank)
            return []
        if self._loss_zero.update(record.rank, loss == 0.0, record.step).count == 1:
            # The engine counts every loss, the spared ones too: 1 is the rank's first.
            if self.counts.seq(record.rank, "loss") == 1:
                self._from_first.add(record.rank)
            else:
                self._from_first.discard(record.rank)
        return []

    def finish(self) -> list[Finding]:
        for rank, zeros in self._loss_zero.items():
            # Every loss of the rank: the run began at its first and is still on (nothing ended it).
            if zeros.count >= _STREAK and rank in self._from_first:
                return self.emit(
                    f"loss is exactly 0.0 in every log from step {zeros.since}: either every label "
                    "is masked or the loss is NaN and hidden by the Trainer's filter; log grad_norm or run "
                    "with logging_nan_inf_filter=False to tell which", zeros.since, rank)
        return []

    def contradiction(self) -> str | None:
        first = self.fired.step
        if first is None or first <= _FROM_START:
            return None
        return (f"the log begins at step {first}, after the start of training: it does not show where the zeros "
                "began, and a memorising run whose loss rounds to 0.0 prints the same")


@register
class ZeroLossAndLearningRate(DetectorBase):
    """LR002: loss and learning rate both exactly 0 in the same log. No step has been applied (DeepSpeed and
    HF AMP step the scheduler only on applied steps, so an LR still at 0 means every step so far was skipped,
    or the schedule starts and stays at 0) and the loss is the NaN filter's 0.0 or a batch with nothing to
    learn. One log proves it: a run that trains prints neither. Fix: look for OVERFLOW lines (fp16 overflow
    on every step: use bf16), the `tried to get lr value before scheduler/optimizer started stepping`
    warning, and the scheduler's warmup settings."""

    wants = frozenset({"lr"})
    spared_when = {"lr": nonzero, "loss": nonzero}
    predicts = {
        "lr": "0 in every log up to this one: no step was applied, so the scheduler never stepped (an LR "
              "logged non-zero before it contradicts it: the scheduler stepped, and one that decays to 0 is "
              "its schedule's end)",
        "loss": "0.0: the NaN filter's stand-in or a batch with nothing to learn",
        "grad_norm": "0.0 (DeepSpeed's until its first applied step), NaN or absent",
        "loss_scale": "halving on every step (fp16 overflow) or absent",
        "eval_loss": "anything",
    }
    code = "LR002"
    name = "lr.zero-with-zero-loss"
    signature = "lr-zero"
    severity = Severity.CRITICAL

    def observe(self, record: Record) -> list[Finding]:
        if record.kind != TRAIN or is_rl(record):  # an RL loss is 0.0 at the start, before the first step
            return []
        if record.signals.get("loss") == 0.0 and record.signals.get("lr") == 0.0:
            # The LR logged before this one (spared records counted too): non-zero when the scheduler stepped.
            before = self.counts.previous(record.rank, "lr") if self.counts.seq(record.rank, "lr") > 1 else None
            self._lr_before = before if self.fired is None else self._lr_before
            return self.emit(f"loss and learning rate are both exactly 0 at step {record.step}: no optimizer step "
                             "has been applied and the loss is not a real one", record.step, record.rank)
        return []

    _lr_before: float | None = None

    def contradiction(self) -> str | None:
        before = self._lr_before
        if before is None or before == 0.0 or not math.isfinite(before):
            return None
        return (f"the learning rate was {before:g} in the log before: the scheduler was stepping, so steps were "
                "applied, and an LR that reaches 0 there is its schedule's end, not a frozen one")
