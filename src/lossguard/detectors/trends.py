"""Loss trends over many logs: not learning, divergence, spikes that recover, benign memorisation.

Thresholds are relative to the run's own typical initial loss (loss levels are not
comparable across versions, GA settings and world sizes), never absolute. The statistics are the engine's
loss profile (core/profile.py), kept once for all of these rules: a rule reads the `TrendMark` of a record
the profile marked (`reads_profile`), or the profile itself at the end.
"""

from __future__ import annotations

import math

from lossguard.core.column_tests import absent
from lossguard.core.findings import Finding, Severity
from lossguard.core.profile import REPEAT_LOGS, RankProfile, TrendMark
from lossguard.core.records import EVAL, TRAIN, Record
from lossguard.detectors._base import DetectorBase, PerRank, is_nonfinite
from lossguard.detectors.registry import register

_FLAT_MIN_LOGS = 16
_FLAT_REL = 0.01  # the loss moved less than 1% between the first and the last logs
_FLAT_FROM_START = 100  # only judge logs that start at the beginning of training, not a plateau
_TINY_GRAD_PER_LOSS = 0.02


class TrendDetector(DetectorBase):
    """A loss trend: `judge` decides on the mark of a record the profile marked."""

    wants = frozenset({"loss", "raw_loss"})
    spared_when: dict = {}  # no train record of its own interest: the profile marks the ones that matter
    reads_profile = True

    def observe(self, record: Record) -> list[Finding]:
        mark = self.profile.mark
        if record.kind != TRAIN or mark is None:
            return []
        return self.judge(record, mark)

    def judge(self, record: Record, mark: TrendMark) -> list[Finding]:
        return []


@register
class LossNotLearning(TrendDetector):
    """LOSS004: the loss does not move: the same value log after log, or (over a whole run logged from
    its start) less than 1% between the first and the last logs. A flat run with a tiny gradient norm
    is LOSS008 (`no-grad-flow`) instead.

    Why it is flat is said from what the run measured, never against it: where the live guard saw the
    weights move (an update ratio above 0, a weight fingerprint that changed) the weights ARE updated and
    there is nothing the model learns from this data (random or misaligned labels, a data problem, an LR
    too small to matter); where it saw them stand still (update ratio 0, one fingerprint throughout) they
    are not updated; a log with neither signal gets both explanations, joined by "or"."""

    predicts = {
        "loss": "the same value log after log, or under 1% of movement from the start to the end",
        "update_ratio": "0 when the weights stand still; above 0 when they move and the data teaches nothing",
        "param_fingerprint": "unchanged when the weights stand still",
        "reward_margin": "0 throughout for a DPO policy identical to its reference (loss ln 2)",
        "grad_norm": "tiny (then LOSS008) or normal",
        "lr": "anything (an LR of 0 is LR001's)",
    }
    code = "LOSS004"
    name = "loss.flat"
    signature = "not-learning"
    severity = Severity.ERROR
    tiny_grad = False  # LOSS008 takes the flat runs whose gradient norm is tiny
    wants = frozenset({"loss", "raw_loss", "update_ratio", "param_fingerprint"})
    # Records that measured the weights come to `observe` too (`_Weights` keeps what they showed).
    spared_when = {"update_ratio": absent, "param_fingerprint": absent}

    def __init__(self) -> None:
        super().__init__()
        self._weights = PerRank(_Weights)

    def observe(self, record: Record) -> list[Finding]:
        if record.kind == TRAIN:
            ratio, fingerprint = record.signals.get("update_ratio"), record.signals.get("param_fingerprint")
            if ratio is not None or fingerprint is not None:
                self._weights[record.rank].note(ratio, fingerprint)
        return super().observe(record)

    def judge(self, record: Record, mark: TrendMark) -> list[Finding]:
        value, streak, since = mark.repeat
        if streak < REPEAT_LOGS:
            return []
        return self.emit(f"loss stays at {mark.loss:g} for {streak} logs from step {since}: the model is "
                         "not learning", since, record.rank, value=mark.loss)

    def finish(self) -> list[Finding]:
        super().finish()
        for rank, flat in self.profile.items():
            found = _flat_from_start(flat)
            if found is None:
                continue
            start, end, grad = found
            if self.tiny_grad != (grad is not None and grad < _TINY_GRAD_PER_LOSS * start):
                continue
            return self.report(flat, rank, start, end, grad)
        return []

    def report(self, flat: RankProfile, rank: int | None, start: float, end: float, grad: float | None):
        weights = self._weights_of(rank)
        updated = None if weights is None else weights.updated()
        head = (f"the loss did not move in {flat.num} logs from the start ({start:.4g} -> {end:.4g}, under "
                f"{_FLAT_REL:.0%})")
        data = {"start": start, "end": end}
        if updated:
            data.update(weights_updated=1, max_update_ratio=weights.largest_ratio)
            why = (f" although the weights are being updated ({weights.evidence()}): the model finds nothing to "
                   "learn in this data (random or misaligned labels, a data or labels problem) or the "
                   "learning rate is too small to matter")
        elif updated is False:
            data.update(weights_updated=0, max_update_ratio=weights.largest_ratio)
            why = (f" and the weights are not being updated ({weights.evidence()}): learning rate 0, frozen "
                   "parameters, or an optimizer that holds other parameters than the model's")
        else:
            why = (": either the weights are not being updated (learning rate, frozen parameters?) or they are "
                   "and there is nothing to learn (random or misaligned labels, a data problem, a learning "
                   "rate too small); the live guard's update ratio tells which")
        return self.emit(head + why, flat.first_step, rank, **data)

    def _weights_of(self, rank: int | None) -> _Weights | None:
        """What was measured of the rank's weights; else of the run (rank None) or of any rank."""
        for key in (rank, None):
            if (weights := self._weights.peek(key)) is not None:
                return weights
        return next((weights for _, weights in self._weights.items()), None)


class _Weights:
    """What a rank's update ratios and weight fingerprints showed: moving, standing still, or nothing."""

    __slots__ = ("largest_ratio", "num_ratios", "first_print", "num_prints", "print_changed")

    def __init__(self) -> None:
        self.largest_ratio: float | None = None
        self.num_ratios = 0
        self.first_print: float | None = None
        self.num_prints = 0
        self.print_changed = False

    def note(self, ratio: float | None, fingerprint: float | None) -> None:
        if ratio is not None and math.isfinite(ratio):
            self.num_ratios += 1
            self.largest_ratio = ratio if self.largest_ratio is None else max(self.largest_ratio, ratio)
        if fingerprint is not None and math.isfinite(fingerprint):
            if self.num_prints and fingerprint != self.first_print:
                self.print_changed = True
            self.first_print = fingerprint if self.first_print is None else self.first_print
            self.num_prints += 1

    def updated(self) -> bool | None:
        """True: measured moving; False: measured standing still; None: not measured."""
        if (self.largest_ratio or 0.0) > 0.0 or self.print_changed:
            return True
        if self.num_ratios or self.num_prints > 1:
            return False
        return None

    def evidence(self) -> str:
        if self.largest_ratio is not None:
            return f"largest update ratio {self.largest_ratio:.3g} in {self.num_ratios} measurement(s)"
        changed = "changed" if self.print_changed else "did not change"
        return f"the weight fingerprint {changed} over {self.num_prints} measurements"


def _flat_from_start(flat: RankProfile) -> tuple[float, float, float | None] | None:
    """(first mean, last mean, mean grad norm) of a run logged from its start whose loss moved under
    1%, else None."""
    if flat.num < _FLAT_MIN_LOGS or flat.first_step is None or flat.first_step > _FLAT_FROM_START:
        return None
    start, end = sum(flat.head) / len(flat.head), sum(flat.tail) / len(flat.tail)
    if start < 0.05 or abs(end - start) > _FLAT_REL * start:
        return None
    return start, end, flat.grad_sum / flat.grad_num if flat.grad_num else None


@register
class LossFlatTinyGrad(LossNotLearning):
    """LOSS008: the loss did not move from the start of the run and the gradient norm is tiny (under 2%
    of the loss): almost nothing trainable receives a gradient (LoRA + reentrant checkpointing leaves
    only biases outside the blocks with one). Reported as `no-grad-flow`; LOSS004 then stays quiet.

    Checked against the epoch column: the mechanism holds the loss where the run started. A log whose first
    record is past its first epoch (a pasted tail without step numbers, which the log's own numbering
    would place at step 1) shows a converged model's plateau, where the gradient is tiny because the loss
    is at its minimum and the LR has decayed: info, not a dead run."""

    predicts = {
        "loss": "flat at the level the run started from, from its first step (a log that begins past its "
                "first epoch does not show that start: a converged plateau looks the same)",
        "grad_norm": "tiny (under 2% of the loss) from the first step: only a few tensors get a gradient",
        "epoch": "from 0 (the run's start)",
        "lr": "anything (a normal schedule)",
        "eval_loss": "flat at the untrained level",
    }
    code = "LOSS008"
    name = "loss.flat-tiny-grad"
    signature = "no-grad-flow"
    severity = Severity.CRITICAL
    tiny_grad = True
    reads_profile = False  # the repeat run is LOSS004's; this code judges only the whole run, at the end
    wants = frozenset({*TrendDetector.wants, "epoch"})  # the weights' measurements are LOSS004's
    spared_when_changes = True  # the first train record, for its epoch; none after it
    _first_epoch: float | None = None
    _seen_train = False

    @property
    def spared_when(self) -> dict | None:
        return {} if self._seen_train else None

    def observe(self, record: Record) -> list[Finding]:
        if record.kind == TRAIN and not self._seen_train:
            self._seen_train, self._first_epoch = True, record.signals.get("epoch")
        return []

    def contradiction(self) -> str | None:
        epoch = self._first_epoch
        if epoch is None or not math.isfinite(epoch) or epoch <= 1.0:
            return None
        return (f"the log's first record is at epoch {epoch:g}: the log begins after the start of training, so "
                "the flat loss is a plateau the run reached (a converged model's gradient is tiny too), not the "
                "level it started from")

    def judge(self, record: Record, mark: TrendMark) -> list[Finding]:
        return []

    def report(self, flat: RankProfile, rank: int | None, start: float, end: float, grad: float | None):
        return self.emit(
            f"the loss did not move in {flat.num} logs ({start:.4g} -> {end:.4g}) and the gradient norm "
            f"is tiny (mean {grad:.3g}): almost nothing trainable receives a gradient",
            flat.first_step, rank, start=start, end=end, mean_grad_norm=grad)


@register
class LossDivergence(TrendDetector):
    """LOSS005: the loss climbs far above where it started (over twice the lowest of the first logs and
    the minimum so far, and 2 above it) and stays there for five logs; or it jumps to over three times that
    and 3 above it and stays there for two logs in a row. A spike from one bad batch is one log: the next
    batch, through weights that are still good, comes back down. A loss that stays at three times the run's
    start for a second log is weights that an update threw out of their basin (a learning rate too high, an
    overflowed step), and a run that trains on from there wastes every later step.

    Checked against the rest of the loss column: weights thrown out of their basin stay out (often at
    chance, ln of the vocabulary, the same on every batch), so a loss that rose above the mean of the run's
    first logs (those before the rise) and whose last five logs came back down under it (a warmup overshoot
    the decaying LR brings back), or came more than half of the way back from its peak to under twice that
    start while varying from batch to batch (a switch to harder data the model is learning), is no
    divergence; the finding stays as a warning that the loss jumped. A live halt on it (`halt_on`, `watch
    --halt-on`) waits 20 logs for that column to speak, unless the LR stepped up 10-fold within the 3 logs
    before the rise (no data does that: the LR explains it); the finding is reported at once."""

    predicts = {
        "loss": "far above the start and staying there to the end of the log: no way back down (last logs "
                "back under the run's first ones, or most of the way back and under twice them while varying "
                "by batch, contradict it)",
        "grad_norm": "large or growing (an update that threw the weights out), or NaN/Inf later",
        "lr": "anything (too high for the run, often at the end of warmup)",
        "eval_loss": "rising with the training loss",
        "loss_scale": "steady, or halving after an overflowed step",
    }
    code = "LOSS005"
    name = "loss.divergence"
    signature = "divergence"
    severity = Severity.CRITICAL
    demoted = Severity.WARNING  # the jump is real and worth a look; the dead run it stood for is not
    _STREAK = 5
    _JUMP_STREAK = 2  # logs in a row that are far (the profile's FAR_FACTOR and FAR_ABOVE)
    # A switch to harder data looks like a divergence for its first logs; a model learning it brings the
    # loss down within a few dozen steps, weights thrown out of their basin do not. A live halt waits this
    # long for that column to speak (the finding itself is reported at once), unless the LR column already
    # explains the jump: a step change of the LR at most LR_RISE_BEFORE logs before it (no data does that).
    SETTLE_LOGS, LR_RISE_BEFORE = 20, 3
    _READS_DATA = 0.01  # spread of the last losses (of their mean) under which every batch scores alike: chance

    @property
    def settle_logs(self) -> int:
        return 0 if self._lr_explains else self.SETTLE_LOGS

    def __init__(self) -> None:
        super().__init__()
        self._peak: dict[int | None, float] = {}  # each rank's highest loss among its high ones
        self._peak_seq: dict[int | None, int] = {}  # its number among the rank's losses
        self._onset_seq: dict[int | None, int] = {}  # the number of the first loss of the run that fired
        self._lr_explains = False  # the LR stepped up just before the rise that fired

    def contradiction(self) -> str | None:
        flat = self.profile.get(self.fired.rank)
        peak = self._peak.get(self.fired.rank)
        if flat is None or peak is None or len(flat.tail) < flat.tail.maxlen:
            return None
        # Where the run started: its first logs before the rise (a run that diverges from its second step
        # has its blow-up among its first logs, and a start that includes it would be the blow-up's).
        before = flat.head[:max(self._onset_seq.get(self.fired.rank, 1) - 1, 0)]
        if not before:
            return None
        start, last, logs = sum(before) / len(before), sum(flat.tail) / len(flat.tail), len(flat.tail)
        # Both readings need the loss to have risen above the start first: a "divergence" that never did is
        # judged against one low outlier (a made-up loss), and its way back says nothing.
        if not peak > start > 0:
            return None
        # Back under where the run started, not merely under the divergence threshold: weights thrown out
        # of their basin settle at chance (ln of the vocabulary), which can sit under twice the start.
        if not flat.high_run and last < start:
            return (f"the loss came back down from its peak {peak:.4g} to {last:.4g} over its last {logs} logs, "
                    f"under the {start:.4g} the run started at: the weights found their way back, as after a "
                    "warmup overshoot or a switch to data the model then learns")
        # Learning new data: more than half of the way back from the peak to the lowest loss before it, under
        # twice the start, and varying from batch to batch as a model that reads its data does. Weights
        # thrown out of their basin may come down from a first blow-up (thousands to hundreds) but stay far
        # above the start, or sit at chance: ln of the vocabulary on every batch alike, whatever the data.
        # Every one of the last logs comes after the peak: a way down, not the climb up to it.
        after_peak = self._peak_seq[self.fired.rank] <= flat.num - logs
        reads_data = max(flat.tail) - min(flat.tail) > self._READS_DATA * last
        if after_peak and reads_data and last < min(2.0 * start, start + 2.0) \
                and last < peak - 0.5 * (peak - flat.minimum):
            return (f"the loss came down from its peak {peak:.4g} to {last:.4g} over its last {logs} logs, more "
                    f"than half of the way back and under twice the {start:.4g} the run started at: the model is "
                    "learning what made it jump (new or harder data); weights thrown out of their basin stay out")
        return None

    def judge(self, record: Record, mark: TrendMark) -> list[Finding]:
        if not mark.high:
            return []
        if mark.loss >= self._peak.get(record.rank, mark.loss):
            self._peak[record.rank], self._peak_seq[record.rank] = mark.loss, mark.seq
        (count, since), (far, far_since) = mark.high_run, mark.far_run  # runs of consecutive losses
        if self.fired is None and (far >= self._JUMP_STREAK or count >= self._STREAK):
            onset = self._onset_seq[record.rank] = mark.seq - (far if far >= self._JUMP_STREAK else count) + 1
            rise = self.profile.lr_rise.get(record.rank)
            self._lr_explains = rise is not None and onset - self.LR_RISE_BEFORE <= rise <= onset
        if far >= self._JUMP_STREAK:
            return self.emit(f"loss jumped from about {mark.reference:.3g} to {mark.loss:.3g} at step "
                             f"{far_since} and stayed above three times its start for {far} logs: an "
                             "update threw the weights out of their basin", far_since, record.rank,
                             baseline=mark.reference, value=mark.loss)
        if count < self._STREAK:
            return []
        return self.emit(f"loss rose from about {mark.reference:.3g} to {mark.loss:.3g} and stayed above "
                         f"twice its start for {count} logs from step {since}", since,
                         record.rank, baseline=mark.reference, value=mark.loss)


@register
class LossSpike(TrendDetector):
    """LOSS006: an isolated loss spike (3x the running average) that comes back down within five logs."""

    code = "LOSS006"
    name = "loss.spike"
    signature = "loss-spike"
    severity = Severity.WARNING

    def judge(self, record: Record, mark: TrendMark) -> list[Finding]:
        if mark.spike is None:
            return []
        at, value, ratio = mark.spike
        return self.emit(f"loss spiked to {value:.3g} at step {at} (about {ratio:.1f}x its running average) "
                         "and recovered", at, record.rank, value=value)


@register
class Memorization(DetectorBase):
    """LOSS007: the loss decayed smoothly to ~0 (under 2% of where it started; prints as 0.0 under
    `round(loss, 4)`) with finite, varying gradient norms: not a dead run. Informational. The eval loss
    tells the two kinds apart: high for memorisation (overfitting), low too for label leakage."""

    wants = frozenset({"eval_loss"})
    spared_when: dict = {}  # evaluations are never batched; the run of tiny losses is the profile's
    code = "LOSS007"
    name = "loss.memorization"
    signature = "memorization"
    severity = Severity.INFO

    def __init__(self) -> None:
        super().__init__()
        self._eval: dict = {}  # rank -> the latest eval loss once the rank had logged a loss

    def observe(self, record: Record) -> list[Finding]:
        if record.kind == EVAL and record.signals.get("eval_loss") is not None:
            for rank, _ in self.profile.items():
                self._eval[rank] = record.signals["eval_loss"]
        return []

    def finish(self) -> list[Finding]:
        for rank, state in self.profile.items():
            if state.tiny_since is None or len(state.tiny_grads) < 2:
                continue
            first, eval_loss = state.head[0], self._eval.get(rank)
            eval_note = ("" if eval_loss is None else
                         f"; eval_loss is {eval_loss:.3g}" + (" (NaN: check for a dead run)"
                                                              if is_nonfinite(eval_loss) else ""))
            data = {}
            if eval_loss is not None and not is_nonfinite(eval_loss):
                data["eval_ratio"] = eval_loss / first  # low: leakage; high: overfitting
            return self.emit(
                f"loss decayed smoothly from {first:.3g} to under 2% of it from step {state.tiny_since} with "
                f"finite, varying grad norms: the model fits its training data almost perfectly (not a dead "
                f"run){eval_note}", state.tiny_since, rank, **data)
        return []
