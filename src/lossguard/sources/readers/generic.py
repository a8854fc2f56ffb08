"""The generic metric reader: any line with a loss-like name next to a number.

Format parsers (HF dicts, DeepSpeed, Megatron, mmengine) know things only they can know. Everything else
users paste (torchtune / Lightning / NeMo progress bars, `Epoch 1, Step 5, Loss: 0.97`, fairseq's
`| loss 9.80 |`, DeepSpeed-Chat's `step: 3|act_loss: 30.9`, JSON with full-width punctuation, a bare
`tensor(nan, device='cuda:0')` printed by `print(loss)`) is read here, so that support does not depend
on a whitelist of tools. One regex finds every `name <sep> number` pair and every `i/N` progress counter
of a line; the pairs are then grouped into segments (a line holding several progress-bar redraws or
several dicts gives one segment each) and each segment becomes at most one record. More shapes, one per
tool, are in tests/unit/test_generic_reader.py.

    >>> [(f.step, f.signals) for f in read(b"Epoch 1, Step 5, Loss: 0.97, lr: 1e-05")]
    [(5, {'epoch': 1.0, 'loss': 0.97, 'lr': 1e-05})]
    >>> [(f.counter, f.signals) for f in read(b"Epoch 0:  25%|##5  | 10/40 [00:02<00:06, train_loss=nan.0]")]
    [((10, 40), {'epoch': 0.0, 'loss': nan})]
    >>> read(b"| valid | epoch 001 | loss 9.80 | nll_loss 9.1")[0].is_eval
    True
    >>> read(b"tensor(2.3041, device='cuda:0', grad_fn=<NllLossBackward0>)")[0].signals
    {'loss': 2.3041}
    >>> read(b"***** Running Evaluation *****")[0].form
    'eval-header'
    >>> read(b"/home/u/x/torch/distributed/c10d_logger.py:83: FutureWarning: x")
    []
"""

from __future__ import annotations

import re

from lossguard.sources.readers.fields import Fields, Form
from lossguard.sources.vocabulary import Role, meaning, put_loss

# Lightning's progress bar prints a non-finite metric as `nan.0` / `inf.0` (its number format appends `.0`).
_NUMBER = rb"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|NaN|NAN|inf|Inf|INF)(?:inity)?(?:\.0+)?"
# A `name <sep> value` pair (`k: v`, `k=v`, `k v`, `| k | v`, `'k': 'v'`, `k=tensor(v, ...)`, `k=[v, ...]`)
# or a progress counter `i/N` (tqdm's `26/101 [`, mmengine-like `[1480/1504]`). A number followed by `%` is a
# percentage, no value of the name before it (kohya's bar `steps:  10%|` names no step 10).
TOKEN = re.compile(
    rb"(?<![\w./])(\d+) ?/ ?(\d+)(?![\w./])"
    rb"|(?<![\w./@-])[\d./@-]*([A-Za-z_][\w./@-]*(?: [A-Za-z_][\w./@-]*)?)['\"]?(?:\s*[:=|]\s*|\s+)\[?['\"]?(?:tensor\()?"
    rb"(" + _NUMBER + rb")(?![\w.%])['\"]?(?:\s*/\s*(\d+))?")
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

# Lines that open a block of the run's final values: wandb's `Run summary:`, HF's `***** train metrics *****`.
SUMMARY_HEADER = re.compile(rb"Run summary:|\*{3,} *\w+ metrics *\*{3,}")
# A line announcing an evaluation, with no metric on it: `***** Evaluating perplexity, Epoch 1/1 *****`.
EVAL_HEADER = re.compile(rb"(?i)(?<![\w/])(?:evaluat(?:e|es|ing|ion)|validat(?:e|ing|ion))(?![\w/])")


def read(line: bytes) -> list[Fields]:
    """The line's segments; or, for a line with no metric that heads a run summary block or announces an
    evaluation, one header field (the placer reads the lines after it in that light)."""
    segments = read_line(line)
    if not any(segment.has_metric() for segment in segments):
        if SUMMARY_HEADER.search(line):
            return [Fields(Form.SUMMARY_HEADER)]
        if EVAL_HEADER.search(line):
            return [Fields(Form.EVAL_HEADER)]
    return segments


def read_line(line: bytes) -> list[Fields]:
    """The segments of a line that hold a signal or a step; [] when the line names no metric."""
    if b"\xe2\x80" in line or b"\xef\xbc" in line:
        for wide, narrow in _FULLWIDTH:
            line = line.replace(wide, narrow)
    if b"tensor(" in line and (loss := _bare_tensor(line.strip())) is not None:
        return [Fields(Form.GENERIC, {"loss": loss})]
    segments: list[Fields] = []
    start = 0
    for end in TQDM_END.finditer(line):
        segments.extend(_segments(line, start, end.end()))
        start = end.end()
    segments.extend(_segments(line, start, len(line)))
    return _last_redraw_per_count(segments) if len(segments) > 1 else segments


def _last_redraw_per_count(segments: list[Fields]) -> list[Fields]:
    """A progress bar redraws once when its counter moves (the postfix still shows the last batch's
    metrics) and again when the new metrics are set: of consecutive redraws at one count, the last holds
    that batch's values (Lightning's `10/40 ... train_loss=5.93` then `10/40 ... train_loss=3.99`)."""
    kept: list[Fields] = []
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


def _segments(line: bytes, start: int, end: int) -> list[Fields]:
    out: list[Fields] = []
    current = Fields(Form.GENERIC)
    names: set[bytes] = set()  # the keys read into the current segment: a key again starts the next one
    first_pair = None
    for match in TOKEN.finditer(line, start, end):
        index, total, raw_key, raw_value, of_total = match.groups()
        if raw_key is None:  # a progress counter: a second one is the next redraw
            if current.counter is not None:
                out.append(current)
                current, names = Fields(Form.GENERIC), set()
            current.counter = (int(index), int(total))
            continue
        if _SOURCE_FILE.search(raw_key):
            continue  # `.../lossguard/x/c10d_logger.py:83: FutureWarning`: a file and line, not a metric
        role, name, rank = meaning(raw_key)[:3]
        if role == Role.SKIP:
            continue
        first_pair = match.start() if first_pair is None else first_pair
        if raw_key in names or role == Role.STEP and current.step is not None and current.has_metric():
            out.append(current)  # the same name again: the next dict or progress-bar redraw
            current, names = Fields(Form.GENERIC), set()
        elif role == Role.STEP and current.step is not None:
            continue  # litgpt's `iter 9 step 2 | loss`: two counters of one moment, the first (finer) stands
        names.add(raw_key)
        _add(current, role, name, rank, _float(raw_value), of_total)
    out.append(current)
    if first_pair is not None and EVAL_MODE.search(line, start, first_pair):
        for segment in out:
            segment.is_eval = True
    pipe = PIPE_STEP.search(line, start, end)
    if pipe and out[0].step is None:
        out[0].step = int(pipe.group(1))
    return [s for s in out if s.signals or s.step is not None or s.named_counter]


def _add(segment: Fields, role: int, name: str | None, rank: int, value: float, of_total: bytes | None) -> None:
    if role == Role.EVAL_STEP:
        segment.is_eval, role = True, Role.STEP
    if role in (Role.STEP, Role.BATCH):
        if not 0 <= value < 1e15:  # a nan, inf or absurd step is no step
            return
        if of_total is not None:  # `step 63/64`: a position within the epoch, like a progress counter
            segment.counter = (int(value), int(of_total))
            segment.named_counter = True
        elif role == Role.STEP:
            segment.step = int(value)
    elif role == Role.EPOCH:
        if value.is_integer() and segment.epoch is None:  # `Epoch: [1] [1480/1504]`, `Epoch 4/150`
            segment.epoch = int(value)
            segment.epochs = int(of_total) if of_total is not None else None
        segment.signals.setdefault("epoch", value)
    elif role == Role.LOSS:
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
