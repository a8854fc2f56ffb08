"""fp16 overflow storms (known issue fp16-activation-overflow): skipped steps one after another, the loss scale
falling to its floor, the LR frozen because DeepSpeed steps the scheduler only on applied steps.

The start-up calibration is benign: DeepSpeed starts at 2^16 (or 2^32) and halves the scale on the
first steps until gradients fit; a skip that halves a scale already under 2^7 (below every framework's
initial scale) is no calibration, wherever it sits in the log. A storm is a streak of skips *after* steps have been applied, a
scale driven to 1 or below (DeepSpeed's `min_loss_scale` default; fairseq's scales go below 1), or
DeepSpeed's own "already at minimum". Intermittent skips while training proceeds (a scale that settles
at 8 with an overflow every other step and the loss still moving) are not a storm: the INFO finding.
"""

from __future__ import annotations

from lossguard.core.column_tests import finite, finite_nonzero, zero
from lossguard.core.findings import Finding, Severity
from lossguard.core.records import EVENT, TRAIN, Record
from lossguard.detectors._base import DetectorBase, LossRun, Streak, is_nonfinite
from lossguard.detectors.registry import register

_MID_RUN_STREAK = 3
_FLOOR_SCALE = 1.0  # DeepSpeed's min_loss_scale default: a scale at or under it cannot halve again
# The lowest scale any common fp16 loop starts from: fairseq's `--fp16-init-scale` default 2^7. DeepSpeed
# starts at 2^initial_scale_power (default 16: 65536), torch / apex GradScaler at 2^16, Megatron at 2^32.
# Start-up calibration halves down from there until the gradients fit; a skip that halves a scale under
# 2^7 is no such search (the run is well past its start, or the search went so far down that the
# gradients, or the forward pass itself, overflow at any scale).
LOWEST_INITIAL_SCALE = 2.0 ** 7
# A record of this shape changes nothing once training has started and no run of skips is open.
_QUIET = {"skipped_steps": zero, "loss": finite_nonzero, "raw_loss": finite_nonzero, "grad_norm": finite}


@register
class OverflowStorm(DetectorBase):
    """SCALE001: fp16 overflow storm: skipped steps in a row after training had started, the loss scale
    driven to 1 or below (or DeepSpeed's "already at minimum"), an overflow whose forward loss is itself non-finite, or (in logs without OVERFLOW
    lines) a learning rate that was moving and froze exactly when the gradient norm went non-finite:
    DeepSpeed steps the scheduler only on applied steps. Until training has started, and while a run of
    skips or of frozen LRs is open, it reads every train record (an applied step ends a run of skips);
    otherwise it is spared records with no skipped step, a finite non-zero loss and a finite gradient
    norm, and reads the LRs and skip counts before a record from the engine's signal counts. Under bf16
    (`check_grad_overflow` skips) the same storm is reported as `nonfinite`.

    The loss a skipped step logs is the forward's, which the scale does not touch: skipped steps whose own
    loss is non-finite, two in a row, are the forward pass overflowing, at start-up too. After training has
    started, the scale halving twice in a row (not a probe that halves back once) is a warning: the
    gradients outgrew a scale that fitted them.

    Checked against the logs after it (once fired, it reads every train record): a storm skips every step
    to the end, the LR frozen. When three logs or more after the last skip apply their step (no skip named,
    a finite gradient norm where logged, a finite non-zero loss that moves), the scaler found a scale the gradients
    fit and training went on (a scale that recalibrates after one bad batch): a warning, not a dead run."""

    predicts = {
        "loss_scale": "halving on every step down to its floor (1), or DeepSpeed's 'already at minimum'",
        "lr": "frozen from the onset to the end (the scheduler steps only on applied steps)",
        "loss": "finite or the NaN filter's 0.0, and no longer falling (nothing is applied); applied, moving "
                "losses after the last skip contradict it",
        "grad_norm": "NaN/Inf on the skipped steps, or absent",
        "skipped_steps": "growing by one every step",
    }
    demoted = Severity.WARNING  # a burst of skipped steps is still worth a look

    wants = frozenset({"overflow", "scale-at-minimum", "skipped_steps", "loss", "raw_loss", "lr", "facts"})
    spared_when_changes = True
    code = "SCALE001"
    name = "scale.overflow-storm"
    signature = "fp16-overflow"
    severity = Severity.CRITICAL

    def __init__(self) -> None:
        super().__init__()
        self.num_skipped = 0
        self._applied_any = False  # a step went through: start-up calibration is over
        self._streak = 0
        self._streak_since: int | None = None
        self._last_skip_step: int | None = None
        self.calibration_skips = 0
        self.midrun_skips = 0
        self.midrun_halvings = 0  # the longest run of mid-run skips that each halved the scale
        self._halvings = 0
        self._nonfinite_skips = 0  # skipped steps in a row whose own (forward) loss is non-finite
        self.lowest_scale: float | None = None
        self._bf16: bool | None = None
        self._frozen = Streak()  # logs with the LR frozen while the gradients are non-finite (rank 0's or the run's)
        self._frozen_rank: int | None = None  # the rank whose LR logs the run counts
        self._past_startup_by_scale = False  # start-up was ruled out by a small scale, not by an applied step

    @property
    def spared_when(self) -> dict | None:
        """Quiet (training started, no run of skips or frozen LRs open): such a record changes nothing here.
        Once fired, none is quiet: the logs after the storm say whether it ended (`review`)."""
        if self._applied_any and self._streak == 0 and self._frozen.count == 0 and self.fired is None:
            return _QUIET
        return None

    _after: LossRun | None = None  # the applied logs since the last skip, once fired

    def _follow(self, record: Record) -> None:
        """After the storm fired: the run of applied logs since the last skipped or frozen one."""
        # A skip needs a non-finite gradient: a log with a finite loss and norm, on no skipped step, applied it
        # (a constant schedule repeats its LR either way, so the LR does not tell).
        loss = record.signals.get("loss")
        skipped = record.step == self._last_skip_step or self._streak or self._frozen.count
        if skipped or loss is None or loss == 0.0 or is_nonfinite(loss) or is_nonfinite(record.signals.get("grad_norm")):
            self._after = None if skipped or loss is not None else self._after
            return
        self._after = self._after or LossRun()
        self._after.add(loss)

    def contradiction(self) -> str | None:
        after = self._after
        if after is None or after.num < _MID_RUN_STREAK or self._streak or not after.moved():
            return None
        return (f"the {after.num} logs after the last skip apply their step (finite, the loss moves, last "
                f"{after.tail[-1]:g}): the scaler found a scale the gradients fit and training went "
                "on, so the storm ended")

    def observe(self, record: Record) -> list[Finding]:
        if record.kind == EVENT:
            return self._event(record)
        if record.kind != TRAIN:
            return []
        if record.rank not in (None, 0):
            # Skips are global; another rank only adds its own non-finite loss on a skipped step.
            raw = record.signals.get("raw_loss")
            if record.step == self._last_skip_step and self._applied_any and is_nonfinite(raw) \
                    and self._streak >= 2:
                return self._fire(record.step, f"rank {record.rank}'s loss is {raw} on a skipped step")
            return []
        forward = record.signals.get("raw_loss", record.signals.get("loss"))
        if self._streak and is_nonfinite(forward):  # a loss logged while a run of skips is open
            # The loss a skipped step logs is the forward's, which the loss scale does not touch: a calibration
            # skip computes a finite one. Two skipped steps in a row whose forward is non-finite are no
            # calibration: the forward pass itself overflows, at any scale.
            self._nonfinite_skips += 1
            if self._nonfinite_skips >= 2:
                return self._fire(self._streak_since, f"the loss is {forward} on {self._nonfinite_skips} skipped "
                                                      "steps in a row: the forward pass itself overflows")
        skipped = record.signals.get("skipped_steps")
        if skipped is not None:
            if record.signals.get("lr") is not None:
                self._frozen.update(False, record.step)  # an LR log the frozen-LR test does not read ends its run
            before = self.counts.previous(record.rank, "skipped_steps")  # the spared records' counts too
            grew = (before is not None and skipped > before) or bool(record.data.get("step_skipped"))
            if grew and record.step != self._last_skip_step:
                return self._skip(record.step, record, record.signals.get("loss_scale"))
            if not grew:
                self._applied(record)
            return []
        if record.signals.get("loss") is not None and record.step != self._last_skip_step:
            self._applied(record)
        found = self._frozen_lr(record)
        if self.fired is not None and not found:
            self._follow(record)
        return found

    def _event(self, record: Record) -> list[Finding]:
        if record.event == "overflow":
            return self._skip(record.step, record, record.data.get("new_scale"))
        if record.event == "scale-at-minimum":
            return self.emit("DeepSpeed reports the fp16 loss scale at its minimum: every step overflows",
                             record.step, evidence="Current loss scale already at minimum")
        if record.event == "facts":
            if record.data.get("bf16") is not None:
                self._bf16 = bool(record.data["bf16"])
            elif record.data.get("fp16"):
                self._bf16 = False
        return []

    def _frozen_lr(self, record: Record) -> list[Finding]:
        lr, grad, loss = record.signals.get("lr"), record.signals.get("grad_norm"), record.signals.get("loss")
        if lr is None:
            return []
        # The two LRs logged before this one, spared records' included (the engine counts every record).
        last, earlier = self.counts.previous(record.rank, "lr"), self.counts.earlier(record.rank, "lr")
        was_moving = last is not None and earlier is not None and last != earlier
        bad = is_nonfinite(grad) or loss == 0.0 or is_nonfinite(loss)
        # Skipped steps freeze the LR where the schedule had it; an LR that moved to exactly 0 was zeroed, not
        # frozen (a schedule at its end, a scheduler bug: the LR rules' business). From the start, a storm
        # holds the warmup's first LR, often 0: that is no move, so it is not this test either.
        # A run counts one rank's LR logs: the run-level log's and rank 0's are numbered apart.
        same_rank = self._frozen_rank == record.rank
        if not same_rank:
            self._frozen.update(False, record.step)
            self._frozen_rank = record.rank
        frozen = bad and lr == last and lr != 0.0 and (was_moving or self._frozen.count > 0)
        self._frozen.update(frozen, record.step)
        if self._frozen.count >= _MID_RUN_STREAK:
            why = f"the gradient norm is {grad:g}" if is_nonfinite(grad) else \
                "the loss is exactly 0.0" if loss == 0.0 else f"the loss is {loss:g}"
            return self._fire(self._frozen.since, f"the learning rate froze at {lr:g} from step "
                                                  f"{self._frozen.since} while {why}: every step is being skipped")
        return []

    def _applied(self, record: Record) -> None:
        loss = record.signals.get("raw_loss") if record.signals.get("raw_loss") is not None else record.signals.get("loss")
        if loss is not None and not is_nonfinite(loss) and loss != 0.0:
            self._applied_any = True
            self._streak = self._nonfinite_skips = self._halvings = 0

    def _skip(self, step: int | None, record: Record, new_scale: float | None) -> list[Finding]:
        if not self._applied_any and _below_startup(record, new_scale):
            self._applied_any = True  # past start-up: this skip and the run of skips it is in are no calibration
            self._past_startup_by_scale = True
        self.num_skipped += 1
        self._last_skip_step = step
        if new_scale is not None:
            self.lowest_scale = new_scale if self.lowest_scale is None else min(self.lowest_scale, new_scale)
        if not self._applied_any:
            self.calibration_skips += 1
        if self._streak == 0:
            self._streak_since = step
        self._streak += 1
        raw = record.signals.get("raw_loss")
        if self._applied_any:
            self.midrun_skips += 1
            attempted = record.data.get("attempted_scale")
            halved = new_scale is not None and attempted is not None and new_scale < attempted
            self._halvings = self._halvings + 1 if halved else 0
            self.midrun_halvings = max(self.midrun_halvings, self._halvings)
        if is_nonfinite(raw) and self._streak >= 2:
            # One skipped step is the protection working; two in a row with a non-finite forward loss
            # means every step now overflows (caught at the next optimizer step after the fault).
            return self._fire(self._streak_since, f"the loss is {raw} on {self._streak} skipped steps in "
                                                  "a row: the forward pass itself overflows")
        if self._applied_any and self._streak >= _MID_RUN_STREAK:
            when = f"with the loss scale already under {LOWEST_INITIAL_SCALE:g} (no start-up calibration)" \
                if self._past_startup_by_scale else "after training had started"
            return self._fire(self._streak_since, f"{self._streak} skipped steps in a row {when}")
        if self.lowest_scale is not None and self.lowest_scale <= _FLOOR_SCALE:
            return self._fire(self._streak_since, f"loss scale driven down to {self.lowest_scale:g}")
        return []

    def _fire(self, step: int | None, why: str) -> list[Finding]:
        if self._bf16:
            return self.emit(f"bf16 steps skipped one after another from step {step}: {why}. Every gradient "
                             "is non-finite; the weights are protected but nothing trains", step,
                             signature="nonfinite", evidence=why)
        return self.emit(
            f"fp16 overflow storm from step {step}: {why}. DeepSpeed skips every such step, so the weights "
            "and the LR schedule are frozen", step, evidence=why)

    def finish(self) -> list[Finding]:
        super().finish()
        if self.fired is not None:
            self.fired.data.update(skipped=self.num_skipped, lowest_scale=self.lowest_scale)
        elif self.midrun_halvings >= 2:
            # A scaler probing upward overflows once and halves back; halving twice in a row mid-run means the
            # gradients outgrew the scale that fitted them: no storm, but the update is growing. A warning.
            return self.emit(
                f"the loss scale halved {self.midrun_halvings} times in a row after training had started (down "
                f"to {self.lowest_scale:g}): the gradients outgrew a scale that fitted them; {self.midrun_skips} "
                "step(s) skipped in all. Watch the loss and grad norm for a spike", self._streak_since,
                severity=Severity.WARNING)
        elif self.midrun_skips:
            return self.emit(
                f"{self.midrun_skips} step(s) skipped after training had started (non-finite gradients); "
                "the optimizer skipped them and the weights stayed finite", self._streak_since,
                severity=Severity.INFO, signature=None)
        elif self.calibration_skips:
            return self.emit(
                f"{self.calibration_skips} fp16 overflow skips at start-up while DeepSpeed calibrated the "
                "loss scale: normal", None, severity=Severity.INFO, signature=None)
        return []


def _below_startup(record: Record, new_scale: float | None) -> bool:
    """The skip halved a scale under every framework's initial scale (LOWEST_INITIAL_SCALE)."""
    attempted = record.data.get("attempted_scale")
    if attempted is None and new_scale is not None:
        attempted = 2 * new_scale  # a dynamic scaler halves on a skip
    return attempted is not None and attempted < LOWEST_INITIAL_SCALE
