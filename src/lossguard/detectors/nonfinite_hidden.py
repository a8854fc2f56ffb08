"""Non-finite values hidden from the log: the Trainer's NaN filter prints 0.0 (LOSS002), DeepSpeed's grad-norm
sentinels (GRAD001); and a second loss column that is NaN beside a finite one (LOSS011). The shown ones
(`nan` / `inf` in the log) are nonfinite.py's."""

from __future__ import annotations

from dataclasses import dataclass

from lossguard.core.column_tests import absent, finite, finite_nonzero
from lossguard.core.findings import Finding, Severity
from lossguard.core.records import EVAL, TRAIN, Record
from lossguard.detectors._base import DetectorBase, PerRank, is_nonfinite, is_rl, no_sentinel, sentinel_index
from lossguard.detectors.registry import register

# Consecutive exact-zero logs after a normal loss that prove the filter artefact on their own.
_ZERO_STREAK = 3
# A finite loss at least this large before the zeros: a real decay to ~0 passes through small values.
_NORMAL_LOSS = 0.05
# LOSS002's: a finite non-zero loss (no raw loss); while a run of zeros is open, no record with a loss.
_ZEROS_SPARED = {"loss": finite_nonzero, "raw_loss": absent}
_ZEROS_OPEN = {"loss": absent, "raw_loss": absent}
# GRAD001's: no sentinel; while a run of one is open, no grad norm.
_NO_SENTINEL = {"grad_norm": no_sentinel}
_EVERY_GRAD = {"grad_norm": absent}


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
    else by a streak of exact zeros.

    Checked against the rest of the loss column: NaN weights never compute a finite loss again, so the
    filter's zeros last to the end of the log. A loss that comes back finite, non-zero and moving for three
    logs or more after the zeros says the weights survived (a window of batches whose loss overflowed and
    whose steps were skipped, a shard with nothing to learn): a warning, not a dead run."""

    predicts = {
        "loss": "exactly 0.0 from the NaN on, to the end of the log (finite, moving losses after the zeros "
                "contradict it: NaN weights never compute one again)",
        "grad_norm": "NaN, Inf or a DeepSpeed sentinel (sqrt(k)) beside the zeros, or absent",
        "eval_loss": "NaN after the onset",
        "lr": "anything (frozen when the steps are skipped)",
        "loss_scale": "halving to its floor under fp16, or absent",
    }
    demoted = Severity.WARNING  # a window of hidden NaN losses is still worth a look

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
            if self.fired is not None and self.fired.rank == record.rank and state.zero_since is not None:
                self._back = (seq, loss)  # the first finite loss after the zeros; the counts tell the rest
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

    _back: tuple[int, float] | None = None

    def contradiction(self) -> str | None:
        rank = self.fired.rank
        state = self._state.peek(rank)
        if self._back is None or state is None or state.zero_since is not None:
            return None  # no way back, or the zeros came again and last to the end
        (seq, first), last = self._back, self.counts.last(rank, "loss")
        num = self.counts.seq(rank, "loss") - seq + 1
        if num < _ZERO_STREAK or last is None or is_nonfinite(last) or last in (0.0, first):
            return None
        return (f"the loss came back after the zeros: {num} finite logs from {first:g} to {last:g} to the end of "
                "the log, and NaN weights never compute a finite loss again: the weights survived the window")

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
    non-finite gradients in ZeRO-1/2 (-1 per param group).

    Checked against the rest of the run: gradients that went NaN leave NaN weights (or skipped steps), so
    the sentinel stays to the end and the loss stops falling. A norm that leaves the value for finite,
    different ones later while the loss falls through the run (the last logs under 90% of the first) was a
    real norm at 1.0: a loop that logs the norm after clipping to max_grad_norm=1.0 prints exactly 1.0
    while the gradients are large, and a loss printed with few digits can repeat meanwhile."""

    predicts = {
        "grad_norm": "sqrt(k) exactly, log after log to the end (finite, different norms later contradict it)",
        "loss": "NaN, the NaN filter's 0.0, or frozen: NaN weights learn nothing (a loss that falls through "
                "the run contradicts it)",
        "lr": "anything (DeepSpeed steps the scheduler through it under bf16)",
        "eval_loss": "NaN or frozen after the onset",
        "loss_scale": "absent (bf16) or steady",
    }

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
        was_open = state.streak > 0
        k = self._track(state, record.step, grad)
        if k is None and was_open and self.fired is not None and self.fired.rank == record.rank \
                and not is_nonfinite(grad):
            self._left_at = record.step  # a finite norm that is no sentinel after the pinned run
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

    _left_at: int | None = None

    def contradiction(self) -> str | None:
        rank = self.fired.rank
        profile, last = self.profile.get(rank), self.counts.last(rank, "grad_norm")
        if self._left_at is None or profile is None or last is None or is_nonfinite(last) or sentinel_index(last):
            return None
        size = min(len(profile.head), len(profile.tail))
        if profile.num < 2 * size or not size:
            return None
        first, final = sum(profile.head[:size]) / size, sum(list(profile.tail)[-size:]) / size
        if not final < 0.9 * first:
            return None
        return (f"the norm leaves the value at step {self._left_at} for finite ones (last {last:g}) and the loss falls "
                f"from {first:.4g} to {final:.4g}: NaN gradients leave NaN weights that learn nothing, so this was "
                "a real norm (one logged after clipping to 1.0 prints exactly 1.0)")

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
