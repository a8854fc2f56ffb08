"""Plain-text training logs: HF Trainer stdout, DeepSpeed lines, Megatron, mmengine, warnings.

Mixed formats in one file are fine: every line is classified on its own. `scan.py` finds the lines
that contain an anchor (`patterns.ANCHOR_STRINGS`); only those reach this parser, so a log of millions
of tqdm / INFO lines costs little more than the scan. DeepSpeed's banner and config dump become facts
in `ds_facts.py`.
"""

from __future__ import annotations

import collections
import math
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from lossguard.core.records import EVAL, EVENT, TRAIN, Record
from lossguard.core.signals import canonical, to_float
from lossguard.sources import patterns as P
from lossguard.sources import progress
from lossguard.sources.ds_facts import facts_from_line
from lossguard.sources.generic import STEP_NAMES, put_loss, read_line
from lossguard.sources.scan import ScanCounts, iter_grep_lines, iter_lines, uncoloured

_DEDUPE_WINDOW = 256
# Lines that open a block of the run's final values: wandb's `Run summary:`, HF's `***** train metrics *****`.
SUMMARY_HEADER = re.compile(rb"Run summary:|\*{3,} *\w+ metrics *\*{3,}")
_SUMMARY_GAP = 40  # lines: a summary block is short, what comes that much later is not in it
# A line announcing an evaluation, with no metric on it: `***** Evaluating perplexity, Epoch 1/1 *****`.
EVAL_HEADER = re.compile(rb"(?i)(?<![\w/])(?:evaluat(?:e|es|ing|ion)|validat(?:e|ing|ion))(?![\w/])")
# A log dict is a metrics log when it names one of these (`loss` first: nearly every one does).
_SIGNAL_KEY = re.compile(rb"(?i)loss|grad_norm|learning.rate|eval_|train_runtime|lr")
_QUOTES = (b"'", b'"')
# `_hf_dict`'s answer for a repeat of a recent dict (another node's copy): read, nothing to emit.
_DUPLICATE = Record(None)


class TextLogParser:
    """Stateful line parser: remembers the last step seen and recent log dicts (per-node duplicates)."""

    def __init__(self, source: str = "") -> None:
        self.source = source
        self.last_step: int | None = None
        self.num_logs = 0
        self._interval = 1  # steps between the last two logged steps, to place logs without a counter
        self._recent_keys: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        self._megatron_skipped = 0.0
        # The key layout of the last metrics dict, and every layout seen (a log repeats one or two).
        self._layout: _Layout | None = None
        self._layouts: dict[tuple[bytes, ...], _Layout | None] = {}
        self._last_log_step: int | None = None
        self._real_steps = False  # a step number was read from the log (not counted)
        self._last_ds_step: int | None = None
        # The step a `step 50` line announced, for the metric lines under it (`train/loss 2.23`), and
        # the values already placed there: a second value of one of them belongs to a later step, the
        # same value again is another node's copy of the line.
        self._context_step: int | None = None
        self._context_values: dict[str, float] = {}
        # The last record whose step was estimated (no counter on its line): a DeepSpeed `step=` line
        # next to it gives its real step (see `records`).
        self.guessed: Record | None = None
        # The last train record that is an estimate made at an evaluation (nanoGPT's `step N: train loss X,
        # val loss Y`): the step's own record after it gives the values (see `merged`).
        self.provisional: Record | None = None
        # A log dict the last line left open (line number, its text so far, its record): see `_open_dict`.
        self._open: tuple[int | None, bytes, Record] | None = None
        # Overflow events before any step number: each is one skipped step, so the n-th is step n.
        self._early_skips = 0
        # The step a running training bar showed on an event's line (sources/progress.py), for the next log
        # that names no step: the log printed after the bar is of that step.
        self._bar_step: int | None = None
        self._last_overflow: tuple | None = None
        self._epochs_from_zero = False  # an epoch written `0/N` was seen: `e/N` epochs count from 0
        self._epoch_length = 0  # the largest per-epoch counter total seen: a full epoch's batches
        # A line announcing an evaluation (`***** Evaluating perplexity *****`) and the last step then: the
        # next metric line naming no step, at that same step, is the evaluation's result.
        self._eval_header: tuple[int | None] | None = None
        # Inside a run summary block (`wandb: Run summary:`, `***** train metrics *****`): the line number of
        # its last line. Its values describe the run's end, not a step of their own.
        self._summary_line: int | None = None

    # -- entry point ---------------------------------------------------------------------------------
    def parse_line(self, line: bytes, line_no: int | None = None) -> list[Record]:
        out: list[Record] = []
        if b"{" in line:  # `_hf_dict` finds no dict without a quote after a brace
            record = self._hf_dict(line, line_no)
            if record is not None:
                if record is not _DUPLICATE:
                    out.append(record)
                return out
        if b"skipped=" in line and (records := self._ds_step(line, line_no)):
            return records  # DeepSpeed's progress line, as common as the log dicts: checked early
        for needle, name, pattern in P.EVENT_NEEDLES:
            if needle in line and (match := pattern.search(line)):
                out.append(self._event(name, match, line_no))
                return out
        for needle, parse in self._PARSERS:
            if needle in line:
                records = parse(self, line, line_no)
                if records:
                    return records
        return self._generic(line, line_no)

    # -- HF Trainer dicts ----------------------------------------------------------------------------
    def whole_line_dict(self, line: bytes, line_no: int | None) -> Record | None:
        """`parse_line`'s record for a line that is one log dict in a learned shape and nothing else (one
        brace each way, so `_hf_dict` would read the whole line), found without its search for the dict;
        None, with nothing changed, for any other line. Most lines of a big log are such a dict."""
        layout = self._layout
        if layout is None or line[-1:] != b"}" or line.count(b"{") != 1 or line.count(b"}") != 1 \
                or line in self._recent_keys or (b"loss" not in line and not _SIGNAL_KEY.search(line)):
            return None
        signals = layout.read(line)
        return None if signals is None else self._next_log(line, signals, line_no)

    def _hf_dict(self, line: bytes, line_no: int | None) -> Record | None:
        # The last `{'` or `{"`: the last brace (one memrchr) when a quote follows it, as it nearly always does.
        start = line.rfind(b"{")
        if line[start + 1:start + 2] not in _QUOTES:
            start, other = line.rfind(b"{'"), line.rfind(b'{"')
            if other > start:
                start = other
        end = line.find(b"}", start)
        if start < 0 or end < 0:
            return self._open_dict(line, start, line_no) if start >= 0 else None
        text = line[start : end + 1]
        if b"loss" not in text and not _SIGNAL_KEY.search(text):
            return None
        # Multi-node runs print each log once per node (`log_on_each_node`): drop exact repeats.
        recent = self._recent_keys
        if text in recent:
            return _DUPLICATE
        layout = self._layout
        signals = layout.read(text) if layout is not None else None
        if signals is not None:  # the same keys, printed the same way, as a dict before: no per-key work
            if not start:  # alone on its line, as nearly every log dict is: no progress bar gives its step
                return self._next_log(text, signals, line_no)
            step, is_eval, is_summary = None, False, False
        else:
            pairs = P.HF_PAIR.findall(text)
            if not pairs:
                return None
            signals, step, is_eval, is_summary = self._pairs(pairs, text)
        self._remember(text)
        if is_summary:
            return Record(step=self.last_step, kind=EVENT, event="train-summary", data=signals,
                          source=self.source, line_no=line_no)
        ordinal = guessed = False
        if step is None:
            if is_eval and self.last_step is not None:
                step = self.last_step
            elif start and (counters := P.TQDM_COUNTER.findall(line, 0, start)):
                # tqdm redraws at most every 0.1 s, so on fast steps the bar printed with a log lags
                # behind the real step; two train logs are never at the same step.
                step = int(counters[-1][0])
                if self._last_log_step is not None and step <= self._last_log_step:
                    step = self._last_log_step + 1
                self._real_steps = True
            else:
                step, ordinal, guessed = self._guess_step()
        else:
            self._real_steps = True
        if not is_eval:
            self.num_logs += 1
            self._advance(step)
            self._last_log_step = step
        record = _train_record(step, signals, self.source, line_no, ordinal, EVAL if is_eval else TRAIN)
        if guessed:
            self.guessed = record
        return record

    def _next_log(self, text: bytes, signals: dict[str, float], line_no: int | None) -> Record:
        """The record of a train log dict that names no step and has nothing before it on its line: the
        general path's outcome for such a dict, without its tests for a step, an evaluation or a summary,
        because it is most lines of a big log."""
        self._remember(text)
        step, ordinal, _ = self._guess_step()
        self.num_logs += 1
        # One interval past the last step: `_advance` would leave the interval as it is.
        self.last_step = self._last_log_step = step
        record = self.guessed = Record(step, None, signals, TRAIN, None, {}, self.source, line_no, ordinal)
        return record

    def _remember(self, text: bytes) -> None:
        """Note a log dict's text, so that another node's copy of it is dropped (the last _DEDUPE_WINDOW)."""
        recent = self._recent_keys
        recent[text] = None
        if len(recent) > _DEDUPE_WINDOW:
            recent.popitem(last=False)

    def _open_dict(self, line: bytes, start: int, line_no: int | None) -> Record | None:
        """A dict the line ends before closing (wrapped by the terminal, or cut): what it holds so far, a
        provisional record; a next line that goes on with it gives the rest (`_dict_goes_on`)."""
        text = line[start:]
        pairs = P.HF_PAIR.findall(text)
        if not pairs or (b"loss" not in text and not _SIGNAL_KEY.search(text)):
            return None
        signals, step, is_eval, _ = self._pairs(pairs)
        if not signals:
            return None
        if step is None:
            step, ordinal, guessed = self._guess_step() if not is_eval or self.last_step is None else \
                (self.last_step, False, False)
        else:
            ordinal = guessed = False
        if not is_eval:
            self.num_logs += 1
            self._advance(step)
        record = _train_record(step, signals, self.source, line_no, ordinal, EVAL if is_eval else TRAIN)
        self.guessed = record if guessed else self.guessed
        self.provisional = record
        self._open = (line_no, text, record)
        return record

    def _dict_goes_on(self, line: bytes, line_no: int | None) -> Record | None:
        """The line after an open dict, when it goes on with it: the whole dict's values at its step."""
        opened, self._open = self._open, None
        if line_no is None or opened[0] is None or line_no != opened[0] + 1:
            return None
        text = opened[1] + line.strip(b"\r")
        if b"}" not in text:
            self._open = (line_no, text, opened[2])  # wrapped over more lines still
        pairs = P.HF_PAIR.findall(text[: text.find(b"}") + 1] if b"}" in text else text)
        signals = self._pairs(pairs)[0] if pairs else {}
        held = self.provisional = opened[2]  # its values so far give way to the whole dict's (`merged`)
        return _train_record(held.step, signals, self.source, line_no, held.step_is_ordinal, held.kind)

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

    def _pairs(self, pairs: list[tuple[bytes, bytes]], text: bytes | None = None) -> tuple[dict[str, float], int | None, bool, bool]:
        """(signals, step, is_eval, is_summary) of a dict's (key, value) pairs; learns the layout of the whole
        dict `text` they were read from, when given."""
        signals: dict[str, float] = {}
        step: int | None = None
        is_eval = is_summary = False
        plain = True
        for raw_key, raw_value in pairs:
            info = _KEYS.get(raw_key)
            if info is None:
                info = _KEYS[raw_key] = _key_info(raw_key)
            name, role = info
            if role == _SKIP:
                continue
            plain = plain and role == _PLAIN
            value = _hf_value(raw_value)
            if role == _SUMMARY:
                is_summary = True
            elif role == _EVAL and value is not None:  # `'eval_loss': None` on a train log is not an eval
                is_eval = True
            elif role == _STEP and value is not None and math.isfinite(value):
                step = int(value)
            elif role == _STEP_OF_MAX:
                step = _first_int(raw_value)
            if name == "loss" and value is not None:
                put_loss(signals, value)  # a second loss column: its NaN is kept (generic.put_loss)
            elif name is not None and value is not None:
                signals[name] = value
        if plain and text is not None:
            keys = tuple(key for key, _ in pairs)
            if keys not in self._layouts and len(self._layouts) < _MAX_LAYOUTS:
                self._layouts[keys] = _Layout()
            self._layout = self._layouts.get(keys)
            if self._layout is not None:
                self._layout.learn(text)
        return signals, step, is_eval, is_summary

    # -- events ----------------------------------------------------------------------------------------
    def _event(self, name: str, match, line_no: int | None) -> Record:
        data: dict = {}
        groups = [g.decode() if g else None for g in match.groups()]
        if name == "overflow":
            if not match.re.groupindex:  # DeepSpeed's ZeRO loss scaler: rank, attempted, new
                data = {"rank": _int(groups[0]), "attempted_scale": to_float(groups[1]),
                        "new_scale": to_float(groups[2])}
            else:
                named = {k: v.decode() if v else None for k, v in match.groupdict().items()}
                data = {"attempted_scale": to_float(named.get("attempted")),
                        "new_scale": to_float(named.get("new") or named.get("set_to"))}
        elif name == "tokenization-mismatch":
            data = {"got": _int(groups[0]), "expected": _int(groups[1])}
        elif name == "trainable-params":
            data = {"count": _int(groups[0].replace(",", ""))}
        elif name == "nonfinite-detected":
            data = {"batch": _int(groups[0])}
        # An event belongs to the step being taken: one past the last logged step, or past the step a training
        # bar on its line shows. Before any step number an overflow is the log's own count of steps (each one
        # skipped); other events follow that count.
        if (bar := progress.bar_step(match.string, match.start())) is not None and bar >= (self.last_step or 0):
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

    # -- DeepSpeed engine progress ---------------------------------------------------------------------
    def _ds_step(self, line: bytes, line_no: int | None) -> list[Record]:
        match = _ds_match(line)
        if match is None:
            return []
        step, skipped, first_lr = match.groups()
        signals = {"skipped_steps": float(skipped)}
        _put_lr(signals, first_lr)
        return [_train_record(self._ds_at(step), signals, self.source, line_no)]

    def ds_step_into(self, held: Record, line: bytes) -> bool:
        """Merge a DeepSpeed `step=` line into `held`, the log dict before it whose step was estimated, as
        parsing the line and merging its record would (see `merged`); False, with nothing changed, if the
        line is not one. No record is made: on a big log this is every other line."""
        if (match := _ds_match(line)) is None or b"{" in line:
            return False
        step, skipped, first_lr = match.groups()
        held.step = self._ds_at(step)
        held_signals = held.signals
        if "skipped_steps" not in held_signals:
            held_signals["skipped_steps"] = float(skipped)
        if "lr" not in held_signals:  # the dict's own LR stands (and this one need not be read)
            _put_lr(held_signals, first_lr)
        held.step_is_ordinal = False
        return True

    def _ds_at(self, step: bytes) -> int:
        """The step a `step=` line names, noted as the log's latest."""
        step = int(step)
        self._real_steps = True
        last_ds = self._last_ds_step
        if last_ds is not None and step > last_ds:
            self._interval = step - last_ds  # where the next log dict without a step goes
        self._last_ds_step = step
        last = self.last_step
        if last is None or step > last:
            self.last_step = step
        return step

    # -- Megatron-LM ------------------------------------------------------------------------------------
    def _megatron(self, line: bytes, line_no: int | None) -> list[Record]:
        match = P.MEGATRON.search(line)
        if not match:
            return []
        step = int(match.group(1))
        signals: dict[str, float] = {}
        for raw_key, raw_value in P.MEGATRON_FIELD.findall(line):
            key, value = raw_key.decode().strip(), to_float(raw_value.decode())
            if value is None:
                continue
            if key == "number of skipped iterations":
                # Megatron counts skips per logging interval; the catalog's signal is cumulative.
                self._megatron_skipped += value
                signals["skipped_steps"] = self._megatron_skipped
            elif (name := canonical(key)) is not None:
                signals[name] = value
        self.last_step = step
        return [Record(step=step, signals=signals, source=self.source, line_no=line_no)]

    # -- mmengine / MMDetection-style ------------------------------------------------------------------
    def _mmengine(self, line: bytes, line_no: int | None) -> list[Record]:
        match = P.MMENGINE.search(line)
        if not match:
            return []
        _, mode, epoch, index, total = match.groups()
        step = int(index) if epoch is None else (int(epoch) - 1) * int(total) + int(index)
        signals: dict[str, float] = {}
        for raw_key, raw_value in P.MMENGINE_FIELD.findall(line, match.end()):
            name = canonical(raw_key.decode())
            value = to_float(raw_value.decode())
            if name is not None and value is not None:
                signals["eval_loss" if mode == b"val" and name == "loss" else name] = value
        kind = EVAL if mode == b"val" else TRAIN
        if kind == TRAIN:
            self.last_step = step
        return [Record(step=step, signals=signals, kind=kind, source=self.source, line_no=line_no)]

    # -- a user script's own `step N loss X ...` lines --------------------------------------------------
    def _plain(self, line: bytes, line_no: int | None) -> list[Record]:
        match = P.PLAIN_STEP.search(line)
        if not match:
            return []
        signals: dict[str, float] = {}
        evaluated: dict[str, float] = {}  # `val loss 2.93`: the eval loss, a record of its own
        for prefix, raw_key, raw_value in P.PLAIN_FIELD.findall(line, match.end()):
            name = canonical(raw_key.decode())
            value = to_float(raw_value.decode())
            if name is not None and value is not None:
                # `val loss 2.9`, `val/loss=2.9` and `eval_loss=2.9` are the evaluation's, a record of their own
                is_eval = name == "eval_loss" or (name == "loss" and prefix not in (b"", b"train"))
                held = evaluated if is_eval else signals
                held["eval_loss" if is_eval else name] = value
        if not signals and not evaluated:
            return []
        rank = _int(match.group(1).decode()) if match.group(1) else None
        step = int(match.group(2))
        out = []
        if evaluated:
            out.append(Record(step=step, rank=rank, signals=evaluated, kind=EVAL, source=self.source, line_no=line_no))
        if signals:
            self.last_step = step if self.last_step is None else max(self.last_step, step)
            out.append(Record(step=step, rank=rank, signals=signals, source=self.source, line_no=line_no))
            if evaluated:  # `train loss X, val loss Y`: both estimated at the evaluation, X is no step's loss
                self.provisional = out[-1]
        return out

    # -- any other line with a loss-like name next to a number (sources/generic.py) -------------------
    def _generic(self, line: bytes, line_no: int | None) -> list[Record]:
        out: list[Record] = []
        if self._open is not None and (rest := self._dict_goes_on(line, line_no)) is not None:
            return [rest]
        segments = read_line(line)
        if not any(_has_signal(segment) for segment in segments) and self._header(line, line_no):
            return out
        self._summary_ends(segments, line_no)
        for segment in segments:
            if segment.counter is not None and segment.epoch is not None:
                self._epoch_length = max(self._epoch_length, segment.counter[1])
            signals, step = segment.signals, segment.resolved_step(self._first_epoch(segment), self._epoch_length)
            if segment.is_eval and "loss" in signals:
                signals["eval_loss"] = signals.pop("loss")
            elif "loss" in signals:
                signals.pop("eval_loss", None)  # a progress bar's stale validation value
            if not _has_signal(segment):
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
            record = self._generic_record(step, signals, kind, line_no)
            out.append(record)
        return out

    def _header(self, line: bytes, line_no: int | None) -> bool:
        """A line that opens a run summary block or announces an evaluation, noted; True if it is one."""
        if SUMMARY_HEADER.search(line):
            self._summary_line = line_no if line_no is not None else 0
            self._context_step, self._context_values = None, {}
            return True
        if EVAL_HEADER.search(line):
            self._eval_header = (self.last_step,)
            return True
        return False

    def _summary_ends(self, segments: list, line_no: int | None) -> None:
        """A summary block is rows of one name and one value; another metric line, or a gap, ends it."""
        if self._summary_line is None or not segments:
            return
        row = len(segments) == 1 and len(segments[0].signals) <= 1 and segments[0].counter is None
        near = line_no is not None and line_no - self._summary_line <= _SUMMARY_GAP
        self._summary_line = line_no if row and near else None

    def _first_epoch(self, segment) -> int:
        """The number the log gives its first epoch: an epoch written `e/N` counts from 1 (`Epoch [1/3]`,
        `Epoch 3/3` the last), unless the log shows an epoch 0 of that form."""
        if segment.epochs is None:
            return 0
        self._epochs_from_zero = self._epochs_from_zero or segment.epoch == 0
        return 0 if self._epochs_from_zero else 1

    def _generic_record(self, step: int | None, signals: dict[str, float], kind: str, line_no: int | None) -> Record:
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
        record = _train_record(step, signals, self.source, line_no, ordinal, kind)
        if guessed:
            self.guessed = record
        if self._summary_line is not None and kind == TRAIN:  # the block's other values are of this record
            self._context_step, self._context_values = step, dict(signals)
        return record

    # -- run facts from the DeepSpeed banner and config dump --------------------------------------------
    def _facts(self, line: bytes, line_no: int | None) -> list[Record]:
        facts = facts_from_line(line)
        if not facts:
            return []
        return [Record(step=None, kind=EVENT, event="facts", data=facts, source=self.source, line_no=line_no)]


# (a literal the line must contain, parser): cheap dispatch for the numeric line formats.
TextLogParser._PARSERS = (
    (b"iteration ", TextLogParser._megatron),
    (b"(train)", TextLogParser._mmengine),
    (b"(val)", TextLogParser._mmengine),
    (b"step ", TextLogParser._plain),
    (b"iter ", TextLogParser._plain),
    (b" ", TextLogParser._facts),
)


# Log-dict key -> (signal name or None, role), computed once per distinct key: a big log repeats a
# handful of keys millions of times.
_SKIP, _PLAIN, _EVAL, _SUMMARY, _STEP, _STEP_OF_MAX = range(6)
_KEYS: dict[bytes, tuple[str | None, int]] = {}


def _key_info(raw_key: bytes) -> tuple[str | None, int]:
    key = raw_key.decode("utf-8", "replace")
    name = canonical(key)
    if key == "train_runtime":
        return name, _SUMMARY
    if key.startswith("eval_") or name == "eval_loss":  # fairseq's `valid_loss`, `val_loss`
        return name, _EVAL
    if key.lower() in STEP_NAMES:  # fairseq's JSON lines count `num_updates`, LLaMA-Factory `current_steps`
        return name, _STEP
    if key == "global_step/max_steps":
        return name, _STEP_OF_MAX
    return name, (_SKIP if name is None else _PLAIN)


_MAX_LAYOUTS = 16
_MAX_SHAPES = 4  # per set of keys: a log prints its dicts one or two ways


class _Layout:
    """How the dicts with one set of keys (all plain metrics) are printed: each shape seen, as a regex of its
    exact text with a group per value (`\\{'loss': (v), 'grad_norm': (v)\\}`), so that a dict printed the same
    way is read with one `fullmatch` instead of a `findall` and a lookup per key. A shape admits only
    values the pair regex reads the same way (no quote, comma or brace inside, no leading space), so it
    gives the values `HF_PAIR.findall` gives (tests/unit/test_text_source.py holds the two to it); any
    other dict goes to `findall`, and its shape is learned."""

    __slots__ = ("shapes", "_tries")

    def __init__(self) -> None:
        self.shapes: list[tuple[re.Pattern[bytes], tuple[tuple[int, str], ...]]] = []
        # Shapes built, kept or not: a dict whose values hold quotes (a tensor repr) makes no shape, and
        # must not cost a build on every line.
        self._tries = 0

    def read(self, text: bytes) -> dict[str, float] | None:
        """The signals of a dict printed in a known shape; None for any other dict."""
        for pattern, named in self.shapes:
            match = pattern.fullmatch(text)
            if match is not None:
                return _floats(named, match.groups())
        return None

    def learn(self, text: bytes) -> None:
        if self._tries >= _MAX_SHAPES or self.read(text) is not None:
            return
        self._tries += 1
        parts: list[bytes] = []
        named: list[tuple[int, str]] = []
        at = 0
        for number, match in enumerate(P.HF_PAIR.finditer(text)):
            start, end = match.span(2)
            parts.append(re.escape(text[at:start]))
            quote = text[start:start + 1]
            if quote in _QUOTES and end - start >= 2 and text[end - 1:end] == quote:
                parts.append(quote + b"([^" + quote + b"]*)" + quote)  # transformers 5: its inside is the value
            else:
                parts.append(rb"""([^\s,}'"][^,}'"]*)""")
            info = _KEYS[match.group(1)]
            if info[1] == _PLAIN:
                named.append((number, info[0]))
            at = end
        parts.append(re.escape(text[at:]))
        if len({name for _, name in named}) < len(named):
            return  # two columns of one signal (`loss` and `lm_loss`): `_pairs` puts them (generic.put_loss)
        pattern = re.compile(b"".join(parts))
        if pattern.fullmatch(text):  # not when a value holds a quote: such a shape would never match
            self.shapes.append((pattern, tuple(named)))


def _ds_match(line: bytes) -> re.Match | None:
    """`DS_STEP.search(line)`, a third as costly: the regex is tried only where its first literal is."""
    at, match = line.find(b"step="), None
    while at >= 0 and (match := P.DS_STEP.match(line, at)) is None:
        at = line.find(b"step=", at + 1)
    return match


def _put_lr(signals: dict[str, float], first_lr: bytes) -> None:
    """A `step=` line's LR, the first param group's (the catalog's lr), when it reads as a number."""
    try:  # noqa: SIM105 (contextlib.suppress costs more than the rest of this line's parse)
        signals["lr"] = float(first_lr)
    except ValueError:
        pass


def _floats(named: tuple[tuple[int, str], ...], groups: tuple[bytes, ...]) -> dict[str, float]:
    """`_hf_value` of each named group, its common case first (this runs once per log line). A shape's group
    holds no quote at its ends (a quoted value's group is its inside), so `float()` takes most as they are."""
    signals = {}
    for index, name in named:
        raw = groups[index]
        try:
            signals[name] = float(raw)
        except ValueError:
            if (value := _hf_value(raw)) is not None:
                signals[name] = value
    return signals


def _hf_value(raw: bytes) -> float | None:
    if raw[:1] in _QUOTES and raw[-1:] == raw[:1]:  # transformers 5 logs strings: {'loss': '4.714'}
        raw = raw[1:-1]
    try:
        return float(raw)  # takes ASCII bytes and spaces: 'nan', 'inf', ' 1e-05' included
    except ValueError:
        pass
    text = raw.strip().strip(b"'\"")
    if text.startswith(b"tensor("):  # transformers 4.38-4.40 logged grad_norm as a tensor repr
        text = text[7:]
    try:
        return float(text)  # float() takes ASCII bytes: 'nan', 'inf', '1e-05' included
    except ValueError:
        return None


def _train_record(step: int, signals: dict[str, float], source: str, line_no: int | None, ordinal: bool = False,
                  kind: str = TRAIN) -> Record:
    """A numbers record, built with positional arguments: half the cost of keywords, once per log line."""
    return Record(step, None, signals, kind, None, {}, source, line_no, ordinal)


def _seen(signals: dict[str, float], seen: dict[str, float]) -> bool:
    """Every value of `signals` is already in `seen` (a NaN matches a NaN): the line is a copy."""
    return all(name in seen and (seen[name] == value or value != value and seen[name] != seen[name])
               for name, value in signals.items())


def _has_signal(segment) -> bool:
    """A segment that holds a signal other than the epoch (not only a step or an epoch counter)."""
    return len(segment.signals) > ("epoch" in segment.signals)


def _first_int(raw: bytes) -> int | None:
    digits = raw.strip(b"'\" ").split(b"/")[0]
    return int(digits) if digits.isdigit() else None


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def merged(parser: TextLogParser, lines: Iterable[tuple[int, bytes]]) -> Iterator[Record]:
    """The parser's records over `lines`, with the records of one step merged into one: a DeepSpeed `step=`
    line and the log dict of that step, a progress bar and the dict printed with it, the metric lines of
    one step block. A log dict whose step had to be estimated takes the step of a `step=` line next to it.
    Fewer, richer records: the detectors see each step once."""
    held: Record | None = None
    held_guessed = False
    parse, whole_line_dict, ds_step_into = parser.parse_line, parser.whole_line_dict, parser.ds_step_into
    for line_no, line in lines:
        # A log dict at an estimated step, then DeepSpeed's `step=` line: the step's one record, at its step.
        if held_guessed and held.kind == TRAIN and held.rank is None and held is not parser.provisional \
                and ds_step_into(held, line):
            held_guessed = False
            continue
        whole = whole_line_dict(line, line_no) if line[:1] == b"{" else None
        for record in parse(line, line_no) if whole is None else (whole,):
            guessed = record is parser.guessed
            if held is not None and held is parser.provisional:
                parser.provisional = None
                if record.step == held.step and record.kind == held.kind and record.rank == held.rank:
                    held.signals.update(record.signals)  # the step's own values replace the estimate
                    continue
            if held is not None:
                if _merge(held, held_guessed, record, guessed):
                    held_guessed = held_guessed and guessed
                    continue
                yield held
            if record.kind == EVENT:
                yield record
                held, held_guessed = None, False
                continue
            held, held_guessed = record, guessed
    if held is not None:
        yield held


def _merge(held: Record, held_guessed: bool, new: Record, new_guessed: bool) -> bool:
    """Merge `new` into `held` (the record before it) when both are one step's numbers; True if merged."""
    if new.kind != held.kind or new.rank != held.rank or new.kind == EVENT:
        return False
    if new.step == held.step:
        pass
    elif held_guessed and _is_ds_step(new):
        held.step = new.step
    elif new_guessed and _is_ds_step(held):
        pass
    else:
        return False
    signals = held.signals
    for name, value in new.signals.items():
        if name not in signals:
            signals[name] = value
    held.step_is_ordinal = held.step_is_ordinal and new.step_is_ordinal and held.step == new.step
    return True


def _is_ds_step(record: Record) -> bool:
    return "skipped_steps" in record.signals and "loss" not in record.signals


def parse_stream(stream: BinaryIO, source: str, counts: ScanCounts | None = None) -> Iterator[Record]:
    """A stream read once, in Python (pipes and in-memory streams; files go through `parse_file`)."""
    yield from merged(TextLogParser(source), iter_lines(stream, counts))


def parse_file(path: Path, counts: ScanCounts | None = None) -> Iterator[Record]:
    lines = iter_grep_lines(path, counts)
    if lines is None:
        return _parse_opened(path, counts)
    return merged(TextLogParser(path.name), lines)  # no generator in between: it would cost per record


def _parse_opened(path: Path, counts: ScanCounts | None) -> Iterator[Record]:
    with open(path, "rb") as stream:
        yield from parse_stream(stream, path.name, counts)


def parse_lines(lines: Iterable[bytes], source: str = "") -> Iterator[Record]:
    """For callers that already have lines (tests, tools): same parser, no chunking."""
    yield from merged(TextLogParser(source), ((n, uncoloured(line)) for n, line in enumerate(lines, 1)))


# Control bytes no log writes (tab, newline, CR, form feed, ESC of colours are fine).
_CONTROL = bytes(b for b in range(32) if b not in (9, 10, 11, 12, 13, 27))


def looks_binary(sample: bytes) -> bool:
    """Weights, archives, images: mostly NUL or many control bytes. A log with a run of NUL bytes (the
    padding a crashed node leaves in a file being written) is still a log."""
    text = sample.replace(b"\x00", b"")
    if len(text) * 2 < len(sample):
        return True
    controls = len(text) - len(text.translate(None, _CONTROL))
    return controls * 20 > len(text)


class TextLogSource:
    name = "text"

    def sniff(self, path: Path, head: bytes) -> bool:
        return not looks_binary(head[:4096])

    def parse(self, path: Path) -> Iterator[Record]:
        return parse_file(path)
