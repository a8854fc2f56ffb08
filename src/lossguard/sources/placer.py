"""The step placer: the one place a text log's fields get their step.

Readers (sources/readers/) say what one line holds; most lines name no step, or name it in a way that means
something only next to the lines before (a log dict follows the last logged step; an OVERFLOW line belongs
to the step being taken; `step 50` heads the metric lines under it; a line after `***** Evaluating *****` is
the evaluation's; another node's copy of a dict is no new step). `StepPlacer` holds that context for one log,
for every format, and turns fields into records (`core.records.Record`).
"""

from __future__ import annotations

import collections

from lossguard.core.records import EVAL, EVENT, TRAIN, Record
from lossguard.sources.readers.fields import Fields, Form
from lossguard.sources.readers.log_dict import joined_signals

_DEDUPE_WINDOW = 256  # log dicts remembered to drop other nodes' copies: far more than nodes per step
_SUMMARY_GAP = 40  # lines: a summary block is short, what comes that much later is not in it


class StepPlacer:
    """Places one log's fields on steps, line after line; the context is documented where it is set."""

    def __init__(self, source: str = "") -> None:
        self.source = source
        self.last_step: int | None = None  # the latest step placed
        self.num_logs = 0  # train logs placed
        self._interval = 1  # steps between the last two logged steps, to place logs without a counter
        self._real_steps = False  # a step number was read from the log (not counted)
        self._last_log_step: int | None = None  # the step of the last train log dict
        self._last_ds_step: int | None = None  # the step of the last DeepSpeed `step=` line
        # The texts of the last log dicts: a dict printed again with the same text is another node's copy
        # (multi-node runs print each log once per node, `log_on_each_node`). An open dict's text is never one.
        self.recent_dicts: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        self._megatron_skipped = 0.0  # Megatron counts skips per logging interval; the signal is cumulative
        self._megatron_loss = False  # a Megatron line of this log printed its loss (`_megatron_vanished`)
        self._megatron_step: int | None = None  # the iteration of the last Megatron line
        # Keras: the epoch of the last `Epoch e/E` header, and whether the log shows bars caught mid-epoch.
        self._keras_epoch = 1
        self._keras_batches = False
        # The step a `step 50` line announced, for the metric lines under it (`train/loss 2.23`), and the
        # values already placed there: a second value of one of them belongs to a later step, the same value
        # again is another node's copy of the line.
        self._context_step: int | None = None
        self._context_values: dict[str, float] = {}
        # The last record whose step was estimated (no counter on its line): a DeepSpeed `step=` line next to
        # it gives its real step (sources/merge.py).
        self.guessed: Record | None = None
        # The last train record that is an estimate made at an evaluation (nanoGPT's `step N: train loss X,
        # val loss Y`) or the first part of a wrapped dict: the step's own record after it gives the values.
        self.provisional: Record | None = None
        # A log dict the last line left open: (its line number, its text so far, its record).
        self.open: tuple[int | None, bytes, Record] | None = None
        self._early_skips = 0  # overflow events before any step number: each is one skipped step
        self._last_overflow: tuple | None = None  # the scales of the last overflow (a copy repeats them)
        # The step a running training bar showed on an event's line, for the next log that names no step.
        self._bar_step: int | None = None
        self._epochs_from_zero = False  # an epoch written `0/N` was seen: `e/N` epochs count from 0
        # A step counter beside a whole epoch number: the last (epoch, step), the largest step, and once the
        # counter restarted with a new epoch, (the first epoch, an epoch's length) (`_across_epochs`).
        self._epoch_counter: tuple[int, int] | None = None
        self._epoch_counter_max = 0
        self._epoch_counter_min: int | None = None
        self._per_epoch: tuple[int, int] | None = None
        self._epoch_length = 0  # the largest per-epoch counter total seen: a full epoch's batches
        # The last step when a line announced an evaluation: the next metric line naming no step, at that same
        # step, is the evaluation's result.
        self._eval_header: tuple[int | None] | None = None
        # Inside a run summary block: the line number of its last line. Its values describe the run's end.
        self._summary_line: int | None = None

    # -- log dicts -------------------------------------------------------------------------------------
    def log_dict(self, fields: Fields, line_no: int | None) -> Record:
        if fields.open:
            return self._open_dict(fields, line_no)
        recent = self.recent_dicts
        recent[fields.text] = None
        if len(recent) > _DEDUPE_WINDOW:
            recent.popitem(last=False)
        if fields.summary:
            return Record(step=self.last_step, kind=EVENT, event="train-summary", data=fields.signals,
                          source=self.source, line_no=line_no)
        step, is_eval = fields.step, fields.kind == EVAL
        ordinal = guessed = False
        if step is not None:
            self._real_steps = True
        elif is_eval and self.last_step is not None:
            step = self.last_step
        elif fields.counter is not None:
            # tqdm redraws at most every 0.1 s, so on fast steps the bar printed with a log lags behind the
            # real step; two train logs are never at the same step.
            step = fields.counter[0]
            if self._last_log_step is not None and step <= self._last_log_step:
                step = self._last_log_step + 1
            self._real_steps = True
        else:
            step, ordinal, guessed = self._guess_step()
        if not is_eval:
            self.num_logs += 1
            self._advance(step)
            self._last_log_step = step
        record = Record(step, None, fields.signals, fields.kind, None, {}, self.source, line_no, ordinal)
        if guessed:
            self.guessed = record
        return record

    def _open_dict(self, fields: Fields, line_no: int | None) -> Record:
        """A dict the line ends before closing: a provisional record; a next line that goes on with it gives
        the rest (`goes_on`)."""
        step, is_eval = fields.step, fields.kind == EVAL
        ordinal = guessed = False
        if step is None:
            step, ordinal, guessed = (self.last_step, False, False) if is_eval and self.last_step is not None \
                else self._guess_step()
        if not is_eval:
            self.num_logs += 1
            self._advance(step)
        record = Record(step, None, fields.signals, fields.kind, None, {}, self.source, line_no, ordinal)
        self.guessed = record if guessed else self.guessed
        self.provisional = record
        self.open = (line_no, fields.text, record)
        return record

    def goes_on(self, line: bytes, line_no: int | None) -> Record | None:
        """The line after an open dict, when it goes on with it: the whole dict's values at its step."""
        opened, self.open = self.open, None
        if line_no is None or opened[0] is None or line_no != opened[0] + 1:
            return None
        text = opened[1] + line.strip(b"\r")
        if b"}" not in text:
            self.open = (line_no, text, opened[2])  # wrapped over more lines still
        first = self.provisional = opened[2]  # its values so far give way to the whole dict's (merge.py)
        return Record(first.step, None, joined_signals(text), first.kind, None, {}, self.source, line_no,
                      first.step_is_ordinal)

    # -- DeepSpeed `step=` lines, Megatron, mmengine, a script's `step N` lines ----------------------------
    def ds_step(self, fields: Fields, line_no: int | None) -> Record:
        step = self.note_ds_step(fields.step)
        return Record(step, None, fields.signals, TRAIN, None, {}, self.source, line_no, False)

    def note_ds_step(self, step: int) -> int:
        """A DeepSpeed `step=` line's step, noted as the log's latest real step; returned."""
        self._real_steps = True
        last_ds = self._last_ds_step
        if last_ds is not None and step > last_ds:
            self._interval = step - last_ds  # where the next log dict without a step goes
        self._last_ds_step = step
        if self.last_step is None or step > self.last_step:
            self.last_step = step
        return step

    def numbered(self, found: list[Fields], line_no: int | None) -> list[Record]:
        """Fields whose line names its step (Megatron, mmengine, `step N loss X`), or evaluations at the last."""
        out = []
        for fields in found:
            signals, step = fields.signals, fields.step
            if step is None:  # an evaluation that names no step (timm's `Test:` lines): at the last step
                if self.last_step is None:
                    continue
                step = self.last_step
            if fields.form == Form.MEGATRON:
                if self._megatron_vanished(signals, step):  # the reader's fact, for the causes: an event too
                    out.append(Record(step=step, kind=EVENT, event="loss-field-vanished", source=self.source,
                                      line_no=line_no, data={"skipped": signals.get("skipped_steps", 0.0)}))
                if "skipped_steps" in signals:
                    self._megatron_skipped += signals["skipped_steps"]
                    signals["skipped_steps"] = self._megatron_skipped
            if fields.kind == TRAIN:
                newer = fields.form != Form.PLAIN or self.last_step is None or step > self.last_step
                self.last_step = step if newer else self.last_step
            record = Record(step=step, rank=fields.rank, signals=signals, kind=fields.kind, source=self.source,
                            line_no=line_no)
            if fields.estimate:  # `train loss X, val loss Y`: both estimated at the evaluation
                self.provisional = record
            out.append(record)
        return out

    def keras(self, found: list[Fields], line_no: int | None) -> list[Record]:
        """Keras bars: the epoch header numbers them. A log of epoch-end bars only (`1875/1875`, what a
        terminal leaves of each epoch) is on epochs: the epoch is the step. A log that shows bars caught
        mid-epoch (`100/1875`) counts batches, the epochs before placed end to end."""
        numbered = []
        for fields in found:
            if fields.counter is None:  # the `Epoch e/E` header
                self._keras_epoch = fields.epoch
                continue
            index, total = fields.counter
            self._keras_batches = self._keras_batches or index < total
            if self._keras_batches:
                self._epoch_length = max(self._epoch_length, total)
                fields.step = (self._keras_epoch - 1) * self._epoch_length + index
            else:
                fields.step = self._keras_epoch
            numbered.append(fields)
        if numbered:
            self._real_steps = True
        return self.numbered(numbered, line_no)

    def _megatron_vanished(self, signals: dict[str, float], step: int) -> bool:
        """Megatron prints a loss only when its interval average is `> 0.0`: a NaN average (bf16 runs have no
        NaN check, so `number of nan iterations` stays 0) or a zero one drops the field from the line. A line
        without its loss in a log whose lines had one is that: a loss no longer finite, read as NaN. An
        interval whose iterations were all skipped (fp16 overflows) drops it too, and is no NaN: its skip
        count says so. True when the line's loss vanished so."""
        last, self._megatron_step = self._megatron_step, step
        if "loss" in signals:
            self._megatron_loss = True
            return False
        skipped = signals.get("skipped_steps", 0.0)
        all_skipped = skipped > 0 and (last is None or step <= last or skipped >= step - last)
        if self._megatron_loss and not all_skipped:
            signals["loss"] = float("nan")
            return True
        return False

    # -- events and facts ------------------------------------------------------------------------------
    def event(self, fields: Fields, line_no: int | None) -> Record:
        """An event belongs to the step being taken: one past the last logged step, or past the step a
        training bar on its line shows. Before any step number an overflow is the log's own count of steps
        (each one skipped); other events follow that count."""
        name, data, bar = fields.event, fields.data, fields.bar
        if fields.form == Form.FACTS:
            step = None
        elif fields.form == Form.GUARD:
            step = fields.step  # the guard names the step it saw
        elif bar is not None and bar >= (self.last_step or 0):
            step = self._at_bar(bar, name)
        elif self.last_step is not None:
            step = self.last_step + 1
        else:
            self._early_skips += name == "overflow" and not self._copy_of_last_overflow(data)
            step = self._early_skips or None
        return Record(step=step, kind=EVENT, event=name, data=data, source=self.source, line_no=line_no)

    def _at_bar(self, bar: int, name: str) -> int:
        """The step of an event printed on a training bar's line at `bar` steps done: the step being taken.
        An overflow says that step was taken (and skipped), so the log printed next is of that step; the
        Trainer's own warnings come while it logs the step the bar shows."""
        self._real_steps = True
        self.last_step = bar
        self._bar_step = bar + 1 if name == "overflow" else bar
        return bar + 1

    def _copy_of_last_overflow(self, data: dict) -> bool:
        """The same halving as the overflow before it (`65536, reducing to 32768` again): one scaler never
        halves from one scale twice in a row, so this is another rank's or host's line of that step."""
        scales = (data.get("attempted_scale"), data.get("new_scale"))
        copy = scales == self._last_overflow and scales[0] != scales[1]
        self._last_overflow = scales
        return copy

    # -- the generic reader's segments -----------------------------------------------------------------
    def segments(self, segments: list[Fields], line_no: int | None) -> list[Record]:
        if segments and segments[0].form in (Form.SUMMARY_HEADER, Form.EVAL_HEADER):
            self._header(segments[0].form, line_no)
            return []
        self._summary_ends(segments, line_no)
        out: list[Record] = []
        for segment in segments:
            if segment.counter is not None and segment.epoch is not None:
                self._epoch_length = max(self._epoch_length, segment.counter[1])
            signals, step = segment.signals, segment.resolved_step(self._first_epoch(segment), self._epoch_length)
            if segment.step is not None and segment.epoch is not None:
                step = self._across_epochs(segment.epoch, segment.step)
            if segment.is_eval and "loss" in signals:
                signals["eval_loss"] = signals.pop("loss")
            elif "loss" in signals:
                signals.pop("eval_loss", None)  # a progress bar's stale validation value
            if not segment.has_metric():
                if step is not None:  # `step 50 token 250m`: the metric lines below are at step 50
                    self._real_steps = True
                    self._context_step, self._context_values = step, {}
                continue
            if step is None and self._context_step is not None and _seen(signals, self._context_values):
                continue  # a copy of a line this step's block already gave (`log_on_each_node`, a host's echo)
            header, self._eval_header = self._eval_header, None
            if step is None and header is not None and header[0] == self.last_step and "loss" in signals:
                signals["eval_loss"] = signals.pop("loss")  # DeepSpeed-Chat's `ppl: 5.8, loss: 1.76`
            kind = TRAIN if "eval_loss" not in signals else EVAL
            out.append(self._segment_record(step, signals, kind, line_no))
        return out

    def _across_epochs(self, epoch: int, step: int) -> int:
        """A step counter that restarts each epoch (NVIDIA DLLogger's `Epoch: 1 Iteration: 100`): once the
        epoch goes up while the counter goes down, each epoch is placed after the ones before it, an epoch as
        long as the largest count the first one reached. A global step never goes down as the epoch rises."""
        last = self._epoch_counter
        self._epoch_counter = (epoch, step)
        if self._per_epoch is None and last is not None and epoch > last[0] and step < last[1]:
            # a counter from 0 (`Step 0` .. `Step 7`) makes an epoch one longer than its largest count
            self._per_epoch = (last[0], self._epoch_counter_max + (self._epoch_counter_min == 0))
        self._epoch_counter_max = max(self._epoch_counter_max, step)
        self._epoch_counter_min = step if self._epoch_counter_min is None else min(self._epoch_counter_min, step)
        if self._per_epoch is None:
            return step
        first, length = self._per_epoch
        return max(epoch - first, 0) * length + step

    def _header(self, form: str, line_no: int | None) -> None:
        if form == Form.SUMMARY_HEADER:
            self._summary_line = line_no if line_no is not None else 0
            self._context_step, self._context_values = None, {}
        else:
            self._eval_header = (self.last_step,)

    def _summary_ends(self, segments: list[Fields], line_no: int | None) -> None:
        """A summary block is rows of one name and one value; another metric line, or a gap, ends it."""
        if self._summary_line is None or not segments:
            return
        row = len(segments) == 1 and len(segments[0].signals) <= 1 and segments[0].counter is None
        near = line_no is not None and line_no - self._summary_line <= _SUMMARY_GAP
        self._summary_line = line_no if row and near else None

    def _first_epoch(self, segment: Fields) -> int:
        """The number the log gives its first epoch: an epoch written `e/N` counts from 1 (`Epoch [1/3]`,
        `Epoch 3/3` the last), unless the log shows an epoch 0 of that form."""
        if segment.epochs is None:
            return 0
        self._epochs_from_zero = self._epochs_from_zero or segment.epoch == 0
        return 0 if self._epochs_from_zero else 1

    def _segment_record(self, step: int | None, signals: dict[str, float], kind: str, line_no: int | None) -> Record:
        ordinal = guessed = False
        if step is not None:
            self._real_steps = True
            self._context_step, self._context_values = step, dict(signals)
        elif self._context_step is not None and not self._context_values.keys() & signals.keys():
            step = self._context_step
            self._context_values.update(signals)
        elif self._summary_line is not None and kind == TRAIN and self.num_logs:
            # A run summary's value of no step (HF's `train_loss`, the run's average): not a step's loss.
            return Record(step=self.last_step, kind=EVENT, event="train-summary", data=signals,
                          source=self.source, line_no=line_no)
        elif kind == EVAL and self.last_step is not None:
            step = self.last_step
        elif self._real_steps and self.last_step is not None:
            step = self.last_step + 1  # a summary line (epoch averages) after the last numbered step
        else:
            step, ordinal, guessed = self._guess_step()
        if kind == TRAIN:
            self.num_logs += 1
            self._advance(step)
        record = Record(step, None, signals, kind, None, {}, self.source, line_no, ordinal)
        if guessed:
            self.guessed = record
        if self._summary_line is not None and kind == TRAIN:  # the block's other values are of this record
            self._context_step, self._context_values = step, dict(signals)
        return record

    # -- steps of logs that name none ------------------------------------------------------------------
    def _guess_step(self) -> tuple[int, bool, bool]:
        """(step, is ordinal, guessed) of a log that names no step: the step a training bar showed since the
        last log, else one interval past the last step. It is an ordinal log number only while the log has
        shown no real step number."""
        bar, self._bar_step = self._bar_step, None
        if bar is not None and (self._last_log_step is None or bar > self._last_log_step):
            return bar, False, True
        if self.last_step is None:
            return 1, True, True
        return self.last_step + self._interval, not self._real_steps, True

    def _advance(self, step: int) -> None:
        if self.last_step is not None and step > self.last_step:
            self._interval = step - self.last_step
        self.last_step = step


def _seen(signals: dict[str, float], seen: dict[str, float]) -> bool:
    """Every value of `signals` is already in `seen` (a NaN matches a NaN): the line is a copy."""
    return all(name in seen and (seen[name] == value or value != value and seen[name] != seen[name])
               for name, value in signals.items())
