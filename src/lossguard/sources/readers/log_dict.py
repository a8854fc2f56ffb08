"""HF Trainer log dicts: `{'loss': 2.3, 'grad_norm': 1.1, 'learning_rate': 1e-05, 'epoch': 0.1}`.

transformers prints one per `logging_steps`, alone on its line or after a progress bar's redraw; transformers
5 quotes the values (`{'loss': '2.3'}`), 4.38-4.40 printed the grad norm as a tensor repr, a multi-node run
prints it once per node behind the node's address. A dict names no step unless it holds a step key; the
placer gives it one (sources/placer.py).

    >>> fields = read(b"{'loss': 2.5, 'grad_norm': 1.2, 'learning_rate': 1e-05}")
    >>> fields.signals, fields.step, fields.kind
    ({'loss': 2.5, 'grad_norm': 1.2, 'lr': 1e-05}, None, 'train')
    >>> read(b"{'eval_loss': 2.1, 'epoch': 1.0}").kind
    'eval'
    >>> read(b"{'train_runtime': 12.0, 'train_loss': 2.2}").summary
    True
    >>> read(b" 40%|####      | 4/10 [00:01<00:02] {'loss': 2.0}").counter
    (4, 10)
    >>> read(b"{'loss': 2.5, 'grad_norm':").open
    True
    >>> read(b"{'model': 'gpt2'}") is None
    True
"""

from __future__ import annotations

import math
import re
from collections.abc import Container

from lossguard.sources import patterns as P
from lossguard.sources.readers.fields import EVAL, TRAIN, Fields, Form
from lossguard.sources.vocabulary import Role, first_int, meaning, put_loss

# A log dict is a metrics log when it names one of these (`loss` first: nearly every one does).
_SIGNAL_KEY = re.compile(rb"(?i)loss|grad_norm|learning.rate|eval_|train_runtime|lr")
_QUOTES = (b"'", b'"')


COPY = Fields(Form.LOG_DICT)  # `read`'s answer for a dict whose text is in `copies`


def read(line: bytes, copies: Container[bytes] = ()) -> Fields | None:
    """The fields of the last log dict on `line`; None when it holds none (or one of no metric); `COPY` when
    its text is one of `copies` (another node's copy of a dict already read: the placer's recent dicts)."""
    # The last `{'` or `{"`: the last brace (one memrchr) when a quote follows it, as it nearly always does.
    start = line.rfind(b"{")
    if line[start + 1:start + 2] not in _QUOTES:
        start, other = line.rfind(b"{'"), line.rfind(b'{"')
        if other > start:
            start = other
    if start < 0:
        return None
    end = line.find(b"}", start)
    if end < 0:
        text = line[start:]
        return _open(text) if b"loss" in text or _SIGNAL_KEY.search(text) else None
    text = line if not start and end == len(line) - 1 else line[start:end + 1]  # alone on its line: no copy
    if b"loss" not in text and not _SIGNAL_KEY.search(text):
        return None
    if text in copies:
        return COPY
    for pattern in _last:  # a known shape (below): one regex match reads the whole dict
        match = pattern.fullmatch(text)
        if match is not None:
            signals, groups = {}, match.groups()
            for index, name in _NAMED[pattern]:
                raw = groups[index]
                try:
                    signals[name] = float(raw)
                except ValueError:  # a shape's group holds no quote at its ends: most values take float()
                    if (value := hf_value(raw)) is not None:
                        signals[name] = value
            step, is_eval, summary = None, False, False
            break
    else:
        pairs = P.HF_PAIR.findall(text)
        if not pairs:
            return None
        signals, step, is_eval, summary = pair_values(pairs, text)
    fields = Fields(Form.LOG_DICT, signals, step, EVAL if is_eval else TRAIN)
    fields.summary, fields.text = summary, text
    if start and step is None and (counters := P.TQDM_COUNTER.findall(line, 0, start)):
        fields.counter = (int(counters[-1][0]), int(counters[-1][1]))  # the bar printed with the log
    return fields


def _open(text: bytes) -> Fields | None:
    """A dict the line ends before closing: what it holds so far (the placer joins the next line to it)."""
    pairs = P.HF_PAIR.findall(text)
    if not pairs:
        return None
    signals, step, is_eval, _ = pair_values(pairs)
    if not signals:
        return None
    fields = Fields(Form.LOG_DICT, signals, step, EVAL if is_eval else TRAIN)
    fields.text, fields.open = text, True
    return fields


def joined_signals(text: bytes) -> dict[str, float]:
    """The signals of an open dict's text joined with the lines that go on with it."""
    close = text.find(b"}")
    pairs = P.HF_PAIR.findall(text[: close + 1] if close >= 0 else text)
    return pair_values(pairs)[0] if pairs else {}


def pair_values(pairs: list[tuple[bytes, bytes]], text: bytes | None = None) -> tuple[dict[str, float], int | None, bool, bool]:
    """(signals, step, is_eval, is_summary) of a dict's (key, value) pairs; learns the shape of the whole
    dict `text` they were read from, when given and every key in it is a plain metric."""
    signals: dict[str, float] = {}
    step: int | None = None
    is_eval = is_summary = False
    plain = True
    for raw_key, raw_value in pairs:
        key = meaning(raw_key)
        if key.step_of_total:
            step, plain = first_int(raw_value), False
            continue
        counts_steps = key.role == Role.STEP and not key.summary and not key.evaluation
        if key.catalog is None and not (key.summary or key.evaluation or counts_steps):
            continue  # of no interest (`total_flos`): it leaves the dict plain
        plain = plain and not (key.summary or key.evaluation or counts_steps)
        is_summary = is_summary or key.summary
        value = hf_value(raw_value)
        if value is None:
            continue
        if counts_steps:
            if math.isfinite(value):
                step = int(value)
            continue
        is_eval = is_eval or key.evaluation  # `'eval_loss': None` on a train log is no evaluation: only a value
        if key.catalog == "loss":
            put_loss(signals, value)  # a second loss column: its NaN is kept (vocabulary.put_loss)
        elif key.catalog is not None:
            signals[key.catalog] = value
    if plain and text is not None:
        _learn(pairs, text)
    return signals, step, is_eval, is_summary


def hf_value(raw: bytes) -> float | None:
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
        return float(text)
    except ValueError:
        return None


# -- known shapes: a dict printed as one before is read with one regex match -------------------------------
_MAX_KEY_SETS = 64  # a log prints dicts of one or two key sets; many logs in one process (a test run, watch) more
_MAX_SHAPES = 4  # per key set: the spacing and quoting of a log's dicts vary little
_SHAPES: dict[tuple[bytes, ...], list[re.Pattern[bytes]]] = {}  # key set -> the shapes its dicts were printed in
_NAMED: dict[re.Pattern[bytes], tuple[tuple[int, str], ...]] = {}  # shape -> (group index, signal name)
_tried: dict[tuple[bytes, ...], int] = {}  # key set -> shapes built for it, kept or not (a quote in a value)
_last: list[re.Pattern[bytes]] = []  # the shapes of the key set of the last dict: the next is most likely one


# A dict printed exactly as a plain-metrics dict before it was is read with one `fullmatch` of that shape
# instead of a `findall` and a lookup per key (`read_found`). A shape admits only values the pair regex reads the
# same way (no quote, comma or brace inside, no leading space), so it gives what `pair_values` gives
# (tests/unit/test_text_source.py holds the two to it). A memo: it changes no result.


def _learn(pairs: list[tuple[bytes, bytes]], text: bytes) -> None:
    keys = tuple(key for key, _ in pairs)
    shapes = _SHAPES.get(keys)
    if shapes is None:
        if len(_SHAPES) >= _MAX_KEY_SETS:
            forget_shapes()
        shapes = _SHAPES[keys] = []
    _last[:] = shapes
    if _tried.get(keys, 0) >= _MAX_SHAPES or any(pattern.fullmatch(text) for pattern in shapes):
        return
    _tried[keys] = _tried.get(keys, 0) + 1
    pattern = _shape(text)
    if pattern is not None:
        shapes.append(pattern)
        _last[:] = shapes


def forget_shapes() -> None:
    """Drop every learned shape (the memo is bounded; tests start from none)."""
    _SHAPES.clear()
    _NAMED.clear()
    _tried.clear()
    _last.clear()


def _shape(text: bytes) -> re.Pattern[bytes] | None:
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
        name = meaning(match.group(1)).catalog
        if name is not None:
            named.append((number, name))
        at = end
    parts.append(re.escape(text[at:]))
    if len({name for _, name in named}) < len(named):
        return None  # two columns of one signal (`loss` and `lm_loss`): `pair_values` puts them (put_loss)
    pattern = re.compile(b"".join(parts))
    if not pattern.fullmatch(text):  # a value holds a quote: such a shape would never match
        return None
    _NAMED[pattern] = tuple(named)
    return pattern
