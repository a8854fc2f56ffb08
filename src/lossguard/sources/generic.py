"""The generic metric reader: any line with a loss-like name next to a number.

Format parsers (HF dicts, DeepSpeed, Megatron, mmengine) know things only they can know. Everything else
users paste (torchtune / Lightning / NeMo progress bars, `Epoch 1, Step 5, Loss: 0.97`, fairseq's
`| loss 9.80 |`, DeepSpeed-Chat's `step: 3|act_loss: 30.9`, JSON with full-width punctuation, a bare
`tensor(nan, device='cuda:0')` printed by `print(loss)`) is read here, so that support does not depend
on a whitelist of tools. One regex finds every `name <sep> number` pair and every `i/N` progress counter
of a line; the pairs are then grouped into segments (a line holding several progress-bar redraws or
several dicts gives one segment each) and each segment becomes at most one record.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from lossguard.core.signals import canonical

# Lightning's progress bar prints a non-finite metric as `nan.0` / `inf.0` (its number format appends `.0`).
_NUMBER = rb"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|NaN|NAN|inf|Inf|INF)(?:inity)?(?:\.0+)?"
# A `name <sep> value` pair (`k: v`, `k=v`, `k v`, `| k | v`, `'k': 'v'`, `k=tensor(v, ...)`, `k=[v, ...]`)
# or a progress counter `i/N` (tqdm's `26/101 [`, mmengine-like `[1480/1504]`).
TOKEN = re.compile(
    rb"(?<![\w./])(\d+) ?/ ?(\d+)(?![\w./])"
    rb"|(?<![\w./@-])[\d./@-]*([A-Za-z_][\w./@-]*(?: [A-Za-z_][\w./@-]*)?)['\"]?(?:\s*[:=|]\s*|\s+)\[?['\"]?(?:tensor\()?"
    rb"(" + _NUMBER + rb")(?![\w.])['\"]?(?:\s*/\s*(\d+))?")
# A source file's name (`c10d_logger.py` in a warning's `path/c10d_logger.py:83:`): a location, never a metric.
_SOURCE_FILE = re.compile(rb"\.(?:py|pyx|c|cc|cpp|cu|cuh|h|hpp)$")
# tqdm's `[elapsed<remaining, rate, postfix]` closes one progress-bar redraw: what follows is another line.
TQDM_END = re.compile(rb"\[[\d:?]+<[^\]\[]*\]")
# torchtune's progress description `epoch|step|Loss: x`.
PIPE_STEP = re.compile(rb"(?<![\w.|])\d+\|(\d+)\|(?=[A-Za-z])")
# `print(loss)` in a custom loop: the line is the loss tensor and nothing else, once what a launcher, logger or
# paste put before every line is off (`_bare_tensor`).
BARE_TENSOR = re.compile(rb"tensor\((" + _NUMBER + rb")(?:,[^)]*)?\)")
# One part of such a prefix: `[rank0]:`, `[default0]:`, `0: `, `10.0.0.1: `, `node-3: `, `> `, a timestamp and
# level (`2024-05-01 10:00:00,123 - INFO - `). A host is a name with a digit in it (`reward: tensor(...)` is
# no loss). Bounded parts, taken one at a time without backtracking: linear on any line.
_PREFIX_PART = re.compile(rb"(?:\[[^\]\n]{0,64}\]:?|(?=[\w.-]{0,63}\d)\w[\w.-]{0,62}:(?!\d)|>|[-|]|\d{4}-\d\d-\d\d|"
                          rb"\d\d:\d\d:\d\d[.,\d]{0,9}|INFO\b|WARNING\b|DEBUG\b)\s*")
# A word before the first pair that says the line is an evaluation (fairseq `| valid |`, `Validation:`).
EVAL_MODE = re.compile(rb"(?i)(?<![\w/])(?:valid|validation|eval|evaluation|val)(?![\w/])")
# Full-width punctuation (pasted through a Chinese IME or forum): JSON with “”：，
_FULLWIDTH = ((b"\xe2\x80\x9c", b'"'), (b"\xe2\x80\x9d", b'"'), (b"\xef\xbc\x9a", b":"), (b"\xef\xbc\x8c", b","))

# Roles of a name. Loss-like names rank: a name that says "train" (reduced_train_loss, Train loss) beats a
# bare `loss` (Lightning's progress-bar `loss` is a display running mean), which beats other *loss names
# (closs, act_loss, nll_loss: the first of those on the line wins).
_SKIP, _SIGNAL, _LOSS, _EVAL_LOSS, _STEP, _EPOCH, _BATCH, _EVAL_STEP = range(8)
STEP_NAMES = {"step", "steps", "iter", "iteration", "global_step", "global step", "num_updates", "current_steps",
               "train/global_step", "trainer/global_step", "global_steps"}
_EPOCH = re.compile(r"(?:train(?:ing)?[ _/])?epoch")
# A step named in two words: MaxText's `completed step: 6`, `train step 12`, `optimizer step: 40`. Singular only:
# `Total optimization steps = 1000` and `training steps: 500` are totals, not the current step.
_STEP_PHRASE = re.compile(r"(?:completed|current|train|optimizer|global|update) (?:step|iter|iteration)")
# The step of an evaluation line (torchtitan's `validate step: 10  loss: 5.21`): its loss is an eval loss.
_EVAL_STEP_PHRASE = re.compile(r"(?:validate|validation|valid|val|eval|evaluation) (?:step|iter|iteration)")
_ROLES: dict[bytes, tuple[int, str | None, int]] = {}


def role_of(raw: bytes) -> tuple[int, str | None, int]:
    """(role, signal name, loss rank) of a name, computed once per distinct name."""
    found = _ROLES.get(raw)
    if found is None:
        found = _ROLES[raw] = _classify(raw.decode("utf-8", "replace").strip().lower())
    return found


def column_name(raw: str) -> str | None:
    """The record key a table column named `raw` feeds: "step", "epoch", "loss", "eval_loss", a signal
    name, or None (a column of no interest)."""
    role, name, _ = role_of(raw.encode())
    return "step" if role == _STEP else None if role == _SKIP else name


def _classify(key: str) -> tuple[int, str | None, int]:
    if key in STEP_NAMES or _STEP_PHRASE.fullmatch(key):
        return _STEP, None, 0
    if _EVAL_STEP_PHRASE.fullmatch(key):
        return _EVAL_STEP, None, 0
    if key.startswith("train ") and (rest := _classify(key[6:]))[0] == _SIGNAL:
        return rest  # Composer's `Train lr-DecoupledAdamW/group0: 1e-05` (its loss is read by the loss rule)
    if key == "batch":  # Composer's `[batch=5/100]:` heads a block of metric lines; a bare `batch 8` is no step
        return _BATCH, None, 0
    if _EPOCH.fullmatch(key):
        return _EPOCH, "epoch", 0
    name = canonical(key)
    if name == "loss":
        return _LOSS, "loss", 0 if "train" in key else 1
    if name == "eval_loss":
        return _EVAL_LOSS, name, 0
    if name is not None:
        return _SIGNAL, name, 0
    if "loss" not in key or "@" in key or "scale" in key or key.startswith("predict"):
        return _SKIP, None, 0
    if key.startswith(("eval", "val", "valid", "test")):
        return _EVAL_LOSS, "eval_loss", 0
    return _LOSS, "loss", 0 if "train" in key else 2


@dataclass(slots=True)
class Segment:
    """What one progress-bar redraw, dict or line says: signals, and the step if it names one."""

    signals: dict[str, float] = field(default_factory=dict)
    step: int | None = None
    counter: tuple[int, int] | None = None
    epoch: int | None = None
    epochs: int | None = None  # N of an epoch written `e/N` (`Epoch [1/3]`): such an epoch may count from 1
    loss_rank: int = 9
    is_eval: bool = False
    # The counter came with a step's name (`[step=5/739328]`, `[batch=5/100]`): a step even on a line of its
    # own, where a bare `3/3` (a loading bar) is none.
    named_counter: bool = False
    names: set[bytes] = field(default_factory=set)

    def resolved_step(self, first_epoch: int = 0, epoch_length: int | None = None) -> int | None:
        """The step the segment names, or its counter within its epoch placed after the epochs before it
        (`first_epoch`: the number the log gives its first epoch, 1 for ColossalAI's `Epoch [1/3]`;
        `epoch_length`: the counter's total in a full epoch, where the log showed one: the last epoch of a
        run cut short by a step limit draws a smaller total, `4/4` after sixteen `n/16`)."""
        if self.step is not None:
            return self.step
        if self.counter is None:
            return None
        index, total = self.counter
        return index if self.epoch is None else \
            max(self.epoch - first_epoch, 0) * max(total, epoch_length or 0) + index


def read_line(line: bytes) -> list[Segment]:
    """Segments of a line that hold a signal or a step; [] when the line names no metric."""
    if b"\xe2\x80" in line or b"\xef\xbc" in line:
        for wide, narrow in _FULLWIDTH:
            line = line.replace(wide, narrow)
    if b"tensor(" in line and (loss := _bare_tensor(line.strip())) is not None:
        return [Segment(signals={"loss": loss})]
    segments: list[Segment] = []
    start = 0
    for end in TQDM_END.finditer(line):
        segments.extend(_segments(line, start, end.end()))
        start = end.end()
    segments.extend(_segments(line, start, len(line)))
    return _last_redraw_per_count(segments) if len(segments) > 1 else segments


def _last_redraw_per_count(segments: list[Segment]) -> list[Segment]:
    """A progress bar redraws once when its counter moves (the postfix still shows the last batch's
    metrics) and again when the new metrics are set: of consecutive redraws at one count, the last holds
    that batch's values (Lightning's `10/40 ... train_loss=5.93` then `10/40 ... train_loss=3.99`)."""
    kept: list[Segment] = []
    for segment in segments:
        if kept and segment.counter is not None and segment.step is None and kept[-1].step is None \
                and (kept[-1].counter, kept[-1].epoch) == (segment.counter, segment.epoch):
            kept[-1] = segment
        else:
            kept.append(segment)
    return kept


def _bare_tensor(line: bytes) -> float | None:
    """The loss of a line that is a printed tensor behind launcher / logger / paste prefixes, else None."""
    bare = BARE_TENSOR.fullmatch(line, past_prefix(line))
    return _float(bare.group(1)) if bare else None


def past_prefix(line: bytes, at: int = 0, end: int | None = None) -> int:
    """Where `line` goes on after what launchers, loggers and pastes put before it (`[rank0]:`, `10.0.0.1: `,
    a timestamp and level, `> `), read from `at` (up to `end`)."""
    end = len(line) if end is None else end
    while (part := _PREFIX_PART.match(line, at, end)) and part.end() > at:
        at = part.end()
    return at


def _segments(line: bytes, start: int, end: int) -> list[Segment]:
    out: list[Segment] = []
    current = Segment()
    first_pair = None
    for match in TOKEN.finditer(line, start, end):
        index, total, raw_key, raw_value, of_total = match.groups()
        if raw_key is None:  # a progress counter: a second one is the next redraw
            if current.counter is not None:
                out.append(current)
                current = Segment()
            current.counter = (int(index), int(total))
            continue
        if _SOURCE_FILE.search(raw_key):
            continue  # `.../lossguard/x/c10d_logger.py:83: FutureWarning`: a file and line, not a metric
        role, name, rank = role_of(raw_key)
        if role == _SKIP:
            continue
        first_pair = match.start() if first_pair is None else first_pair
        if raw_key in current.names or role == _STEP and current.step is not None and _has_metric(current):
            out.append(current)  # the same name again: the next dict or progress-bar redraw
            current = Segment()
        elif role == _STEP and current.step is not None:
            continue  # litgpt's `iter 9 step 2 | loss`: two counters of one moment, the first (finer) stands
        current.names.add(raw_key)
        _add(current, role, name, rank, _float(raw_value), of_total)
    out.append(current)
    if first_pair is not None and EVAL_MODE.search(line, start, first_pair):
        for segment in out:
            segment.is_eval = True
    pipe = PIPE_STEP.search(line, start, end)
    if pipe and out[0].step is None:
        out[0].step = int(pipe.group(1))
    return [s for s in out if s.signals or s.step is not None or s.named_counter]


def put_loss(signals: dict[str, float], value: float, preferred: bool = True) -> None:
    """A loss column's value into a log's signals, where another loss column may be there already (`loss` and
    `lm_loss`, `train_loss` and `reduced_train_loss`): the preferred one is the loss; the other, when it is
    NaN/Inf, is kept as `other_loss`, so that a NaN in any loss column reaches the detectors (LOSS011) and a
    reader's choice of column never hides one. Every reader puts its loss columns through here."""
    held = signals.get("loss")
    if held is None:
        signals["loss"] = value
        return
    kept, other = (value, held) if preferred else (held, value)
    signals["loss"] = kept
    if other != other or other in (math.inf, -math.inf):
        signals["other_loss"] = other


def _has_metric(segment: Segment) -> bool:
    """The segment holds a signal other than the epoch (`Epoch 1 | iter 5 step 1` has none yet)."""
    return len(segment.signals) > ("epoch" in segment.signals)


def _add(segment: Segment, role: int, name: str | None, rank: int, value: float, of_total: bytes | None) -> None:
    if role == _EVAL_STEP:
        segment.is_eval, role = True, _STEP
    if role in (_STEP, _BATCH):
        if not 0 <= value < 1e15:  # a nan, inf or absurd step is no step
            return
        if of_total is not None:  # `step 63/64`: a position within the epoch, like a progress counter
            segment.counter = (int(value), int(of_total))
            segment.named_counter = True
        elif role == _STEP:
            segment.step = int(value)
    elif role == _EPOCH:
        if value.is_integer() and segment.epoch is None:  # `Epoch: [1] [1480/1504]`, `Epoch 4/150`
            segment.epoch = int(value)
            segment.epochs = int(of_total) if of_total is not None else None
        segment.signals.setdefault("epoch", value)
    elif role == _LOSS:
        put_loss(segment.signals, value, rank < segment.loss_rank)
        segment.loss_rank = min(rank, segment.loss_rank)
    else:
        segment.signals.setdefault(name, value)


def _float(raw: bytes) -> float:
    """A matched number; `nan.0` / `inf.0` (Lightning's bar) without the `.0` float() refuses."""
    try:
        return float(raw)
    except ValueError:
        return float(raw.split(b".", 1)[0])
