"""Zero from the start: masked labels (loss 0 and grad 0) and no gradient flow (grad 0, loss normal); the
bare `zero-loss` is in zeros_loss.py. Known issues template-mismatch, truncation-cuts-answers, masked-batch-nan, lora-reentrant-checkpointing."""

from __future__ import annotations

from lossguard.core.column_tests import absent, nonzero
from lossguard.core.findings import Finding, Severity
from lossguard.core.records import EVENT, TRAIN, Record
from lossguard.detectors._base import DetectorBase, LossRun, Streaks, is_nonfinite, is_rl, sentinel_index
from lossguard.detectors.registry import register

_STREAK = 2  # two logs, not one: a single fp16 skip also logs grad_norm 0.0
# Distinct samples (got, expected) whose mismatch warnings must all show one offset before the offset says
# "the template" rather than "these samples": one sample shows an offset, two that agree show a rule.
_SYSTEMATIC_SAMPLES = 2
# While a detector's run is open it is spared no record that carries the signal its run is counted on.
_MASKED = {"num_label_tokens": nonzero, "loss": nonzero}  # a streak of zeros needs a zero loss
_MASKED_OPEN = {**_MASKED, "grad_norm": absent}
_GRAD_NONZERO, _EVERY_GRAD = {"grad_norm": nonzero}, {"grad_norm": absent}


@register
class MaskedLabels(DetectorBase):
    """LABEL001: no supervised tokens. Live: `num_label_tokens == 0` on a rank. Logs: loss and grad_norm
    both exactly 0 (transformers >= 4.46 sums the loss over zero tokens), or label-masking warnings
    (LLaVA/FastChat `tokenization mismatch`, TRL `Could not find response key`, InternVL image tokens).

    Checked against the loss column: masked labels take the loss from where it was straight to exactly 0
    (or hold it there from the first log); a loss that decayed through tiny non-zero values (under 2% of its
    start, the loss profile's run of tiny losses, begun before the zeros) into the zeros is a memorised model
    whose loss and gradient shrank until they print as 0, not a masked batch."""

    predicts = {
        "loss": "exactly 0.0, from the first log or straight from a normal value (a loss that decays through "
                "tiny non-zero values into the zeros contradicts it: memorisation)",
        "grad_norm": "exactly 0 on the same logs (no token, no gradient)",
        "num_label_tokens": "0 (live)",
        "lr": "anything (the schedule steps on)",
        "eval_loss": "0.0, NaN or absent (the same preprocessing masks the eval set)",
    }

    wants = frozenset({"num_label_tokens", "loss", "tokenization-mismatch", "response-key-missing",
                       "image-token-mismatch", "overflow", "facts"})
    spared_when_changes = True  # while a run of zero losses and norms is open (`spared_when`)
    code = "LABEL001"
    name = "labels.all-masked"
    signature = "masked-labels"
    severity = Severity.CRITICAL
    _WARNING_EVENTS = ("tokenization-mismatch", "response-key-missing", "image-token-mismatch")

    def __init__(self) -> None:
        super().__init__()
        self._both_zero = Streaks()  # loss and grad_norm both exactly 0, over the logs with a grad norm
        self.num_warnings = 0
        self._first_warning_step: int | None = None
        self._first_zero_loss: tuple | None = None  # (step, rank) of the first loss of exactly 0.0
        # The (got, expected) token counts of each distinct `tokenization mismatch` sample, for `_template_cut`.
        self._mismatches: set[tuple[int, int]] = set()
        # An fp16 run may skip a step, which also logs loss 0.0 (a NaN through the filter) and grad_norm 0.0:
        # there one such log is not proof, two in a row are.
        self._may_skip = False

    @property
    def spared_when(self) -> dict:
        return _MASKED_OPEN if self._both_zero.open else _MASKED

    def observe(self, record: Record) -> list[Finding]:
        if record.kind == EVENT:
            if record.event in self._WARNING_EVENTS:
                self.num_warnings += 1
                if self._first_warning_step is None:
                    self._first_warning_step = record.step
                got, expected = record.data.get("got"), record.data.get("expected")
                if got is not None and expected is not None and len(self._mismatches) < 4096:
                    self._mismatches.add((got, expected))
            elif record.event == "overflow" or (record.event == "facts" and record.data.get("fp16")):
                self._may_skip = True
            return []
        if record.kind != TRAIN:
            return []
        tokens = record.signals.get("num_label_tokens")
        loss, grad = record.signals.get("loss"), record.signals.get("grad_norm")
        # A count of supervised tokens above 0 (the live guard's) is a supervised batch: a loss and norm of
        # exactly 0 beside it are a saturated model's (memorised, or weights blown up), never masked labels.
        if grad is not None and (tokens is not None or loss is None or is_rl(record)):
            self._both_zero.end(record.rank)  # a log with a grad norm that is not part of the run
        if tokens is not None and tokens == 0:
            return self.emit(
                f"rank {record.rank} had 0 supervised tokens (all labels are -100) at step {record.step}",
                record.step, record.rank, evidence="num_label_tokens == 0")
        if tokens is not None or loss is None or is_rl(record):
            return []  # an RL trainer's loss is a policy objective, legitimately 0.0 (GRAD006 judges it)
        if loss == 0.0 and self._first_zero_loss is None and not (is_nonfinite(grad) or sentinel_index(grad)):
            # a zero beside a NaN or sentinel norm is the NaN filter's, not a masked batch's
            self._first_zero_loss = (record.step, record.rank)
        if grad is None:
            return []
        streak = self._both_zero.update(record.rank, loss == 0.0 and grad == 0.0, record.step)
        if streak.count >= (_STREAK if self._may_skip else 1):
            self._both_zero_fired = self.fired is None or self._both_zero_fired
            why = f"; {self.num_warnings} label-masking warnings in the log" if self.num_warnings else ""
            return self.emit(
                f"loss and grad_norm are both exactly 0 from step {streak.since}: no label is "
                f"supervised, so there is nothing to learn{why}",
                streak.since, record.rank, warnings=self.num_warnings)
        return []

    def finish(self) -> list[Finding]:
        super().finish()
        if self.fired is None and self.num_warnings and self._first_zero_loss is not None:
            step, rank = self._first_zero_loss
            return self.emit(
                f"{self.num_warnings} label-masking warnings (tokenization mismatch / response key / image "
                f"tokens) and the loss is exactly 0.0 from step {step}: the preprocessing masked every label, "
                "so there is nothing to learn", step, rank, warnings=self.num_warnings)
        if self.fired is None and (offset := self._template_cut()) is not None:
            return self.emit(
                f"{self.num_warnings} label-masking warnings, and every 'tokenization mismatch' is off by the same "
                f"{offset:+d} tokens ({len(self._mismatches)} samples): the conversation template does not match "
                "the tokenizer, so every sample is cut and fully masked and the run learns nothing",
                self._first_warning_step, warnings=self.num_warnings, offset=offset)
        if self.fired is None and self.num_warnings:
            return self.emit(
                f"{self.num_warnings} label-masking warnings (tokenization mismatch / response key / image "
                "tokens): those samples train on nothing", self._first_warning_step,
                severity=Severity.WARNING, warnings=self.num_warnings)
        if self.fired is not None:
            self.fired.data["warnings"] = self.num_warnings
        return []

    _both_zero_fired = False

    def contradiction(self) -> str | None:
        # The loss profile's run of losses under 2% of the run's first (zeros included) began before the
        # zeros of loss and norm did: the loss decayed into them.
        profile, since = self.profile.get(self.fired.rank), self.fired.step
        if not self._both_zero_fired or profile is None or profile.tiny_since is None or since is None \
                or profile.tiny_since >= since:
            return None
        return (f"the loss decayed from {profile.head[0]:.4g} to under 2% of it from step {profile.tiny_since}, "
                f"before the zeros of step {since}: a memorised model's loss and gradient shrink until they print "
                "as 0, masked labels jump there")

    def _template_cut(self) -> int | None:
        """The offset (expected - got) every mismatch warning shows, when the warnings say that every sample
        is cut: LLaVA / FastChat / InternVL's preprocess counts each turn's tokens with the template and
        masks the whole sample when the count is off. A wrong template (separator, BOS/EOS handling) is off
        by the same tokens on every sample (+14 for a ChatML tokenizer under `--version v1`, -1 for Llama-3
        under the Llama-2 template), whatever the sample's length; samples cut for their own reasons
        (truncation, odd turns) are off by varying amounts. Two distinct samples with one offset and no other
        make it a rule. A logged loss that is finite and not 0.0 says some samples still train (a mixed
        dataset where one source's template is wrong): then it stays a warning."""
        offsets = {expected - got for got, expected in self._mismatches}
        if len(self._mismatches) < _SYSTEMATIC_SAMPLES or len(offsets) != 1:
            return None
        if any(profile.nonzero for _, profile in self.profile.items()):
            return None
        return offsets.pop()


@register
class NoGradientFlow(DetectorBase):
    """GRAD002: gradient norm exactly 0 while the loss is finite and non-zero, two logs in a row: nothing
    trainable gets a gradient (LoRA + reentrant checkpointing without input grads, frozen modules). The
    other no-gradient conditions have their own codes: GRAD003 (0 trainable parameters), GRAD004 (live:
    tensors without a gradient), GRAD005 (live: tensors outside the optimizer), LOSS008 (flat loss with
    a tiny gradient norm)."""

    wants = frozenset({"grad_norm", "overflow", "no-input-grad"})
    spared_when_changes = True  # while a run of zero norms is open, every grad norm
    predicts = {
        "grad_norm": "exactly 0, log after log",
        "loss": "finite, not 0, and no trend: weights that get no gradient do not change, so the loss only "
                "wanders with the batches (a loss that falls through the run contradicts it)",
        "lr": "anything (the schedule steps whether or not a gradient arrives)",
        "eval_loss": "flat",
        "loss_scale": "steady (an fp16 skip also logs grad_norm 0: those steps are left out)",
    }
    code = "GRAD002"
    name = "grad.no-flow"
    signature = "no-grad-flow"
    severity = Severity.CRITICAL

    def __init__(self) -> None:
        super().__init__()
        self._grad_zero = Streaks()  # grad_norm 0, loss finite and non-zero
        self._losses: dict[int | None, LossRun] = {}  # each rank's losses over its current run of zero norms
        self._fired_losses: LossRun | None = None  # those of the run that fired
        self._overflow_steps: set[int] = set()
        self.hints: list[str] = []

    @property
    def spared_when(self) -> dict:
        return _EVERY_GRAD if self._grad_zero.open else _GRAD_NONZERO

    def observe(self, record: Record) -> list[Finding]:
        if record.kind == EVENT:
            return self._event(record)
        if record.kind != TRAIN:
            return []
        loss, grad = record.signals.get("loss"), record.signals.get("grad_norm")
        if grad is None:
            return []
        if loss is None:
            self._grad_zero.end(record.rank)
            return []
        # An fp16 skip also logs grad_norm 0.0: such a step breaks the run instead of extending it.
        holds = grad == 0.0 and loss != 0.0 and not is_nonfinite(loss) and record.step not in self._overflow_steps
        streak = self._grad_zero.update(record.rank, holds, record.step)
        if streak.count == 1:
            self._losses[record.rank] = LossRun()
        if streak.count:
            self._losses[record.rank].add(loss)
        if streak.count >= _STREAK:
            if self.fired is None:
                self._fired_losses = self._losses[record.rank]
            hint = f" ({'; '.join(self.hints)})" if self.hints else ""
            # A zero norm beside an LR still at 0 is what a skipped step prints (DeepSpeed returns before
            # computing the norm, and the scheduler does not step): the ranking reads it.
            lr = record.signals.get("lr")
            data = {} if lr is None else {"lr_zero": int(lr == 0.0)}
            return self.emit(
                f"grad_norm is exactly 0 from step {streak.since} while the loss is {loss:g}: "
                f"no trainable parameter receives a gradient{hint}", streak.since, record.rank, **data)
        return []

    def contradiction(self) -> str | None:
        fell = self._fired_losses.fell() if self._fired_losses is not None else None
        if fell is None:
            return None
        return (f"the loss falls from {fell[0]:.4g} to {fell[1]:.4g} over the {self._fired_losses.num} logs with "
                "grad_norm 0: the weights are updated, so the logged norm is not the gradient's (a layer-wise "
                "optimizer steps each parameter inside its gradient hook and frees the gradient, so the "
                "Trainer's norm sees none)")

    def _event(self, record: Record) -> list[Finding]:
        if record.event == "overflow" and record.step is not None:
            self._overflow_steps.add(record.step)
        elif record.event == "no-input-grad":
            self.hints.append("PyTorch warned 'None of the inputs have requires_grad=True'")
        return []


def _names(data: dict) -> str:
    """The first parameter names of an event, for a message."""
    count = data.get("count", 0)
    return ", ".join(data.get("params", [])[:5]) + ("..." if count > 5 else "")


class _OneEvent(DetectorBase):
    """Reports the first event of one name (the live monitor's first-step checks, a Trainer line)."""

    event_name = "?"
    signature = "no-grad-flow"

    def observe(self, record: Record) -> list[Finding]:
        if record.kind == EVENT and record.event == self.event_name:
            return self.on_event(record)
        return []

    def on_event(self, record: Record) -> list[Finding]:
        raise NotImplementedError


@register
class NoTrainableParameters(_OneEvent):
    """GRAD003: the Trainer reports 0 trainable parameters (`Number of trainable parameters = 0`): every
    weight is frozen, so nothing can learn."""

    wants = frozenset({"trainable-params"})
    event_name = "trainable-params"
    code = "GRAD003"
    name = "grad.no-trainable-params"
    severity = Severity.CRITICAL

    def on_event(self, record: Record) -> list[Finding]:
        if record.data.get("count") != 0:
            return []
        return self.emit("the Trainer reports 0 trainable parameters", record.step,
                         evidence="Number of trainable parameters = 0")


@register
class ParametersWithoutGradient(_OneEvent):
    """GRAD004 (live): after the first backward, trainable parameter tensors hold no gradient (frozen by
    reentrant checkpointing without input grads, or outside the loss's graph). Critical when none of
    the trainable tensors got one."""

    wants = frozenset({"no-grad"})
    event_name = "no-grad"
    code = "GRAD004"
    name = "grad.params-without-grad"
    severity = Severity.ERROR

    def on_event(self, record: Record) -> list[Finding]:
        count = record.data.get("count", 0)
        total = record.data.get("num_trainable", record.data.get("total"))
        every = total is not None and count >= total
        return self.emit(
            f"{count} trainable parameter tensors got no gradient at step {record.step} "
            f"{'on any rank' if record.rank is None else f'on rank {record.rank}'} ({_names(record.data)})",
            record.step, record.rank,
            severity=Severity.CRITICAL if every else Severity.ERROR, params=record.data.get("params", []))


@register
class ParametersNotInOptimizer(_OneEvent):
    """GRAD005 (live): trainable parameter tensors that the optimizer does not hold, so they are never
    updated (a module created or replaced after the optimizer was built)."""

    wants = frozenset({"trainable-not-in-optimizer"})
    event_name = "trainable-not-in-optimizer"
    code = "GRAD005"
    name = "grad.params-not-in-optimizer"
    severity = Severity.ERROR

    def on_event(self, record: Record) -> list[Finding]:
        count = record.data.get("count", 0)
        return self.emit(
            f"{count} trainable parameter tensors are not in the optimizer and will never be updated "
            f"({_names(record.data)}); was a module created or replaced after the optimizer?",
            record.step, record.rank, params=record.data.get("params", []))
