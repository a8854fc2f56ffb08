"""Meaning-preserving variants of a pasted log (metamorphic tests of `lossguard analyze`).

Each transformation rewrites a log the way capturing or pasting it could have (a launcher's prefix on every
line, a GitHub fence, CRLF, colour codes, noise between metric lines, the head cut off, every metric line
printed by each node, transformers-5 quoting of a log dict), and returns None where the rewrite would not
preserve what the log says for that log (the reason is in the function's docstring). Used by
bench/real_logs.py --variants and tests/unit/test_real_log_variants.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable

# A line that carries a metric: a metric-like name and a number (or nan/inf) on it. Only used to decide
# where noise goes and which lines a second node would print again.
_METRIC_NAME = re.compile(r"(?i)loss|\blr\b|learning|grad|gnorm|reward|tensor\(|\biter|\bstep|epoch")
_NUMBER = re.compile(r"\d|\bnan\b|\binf\b", re.IGNORECASE)


def is_metric_line(line: str) -> bool:
    return bool(_METRIC_NAME.search(line) and _NUMBER.search(line))


def is_json_document(text: str) -> bool:
    """A pretty-printed JSON file pasted whole (trainer_state.json): its lines are not log lines."""
    first = text.lstrip().split("\n", 1)[0].strip()
    return first in ("{", "[")


def _lines(text: str) -> list[str]:
    return text.splitlines()


def _join(lines: list[str]) -> str:
    return "\n".join(lines) + "\n"


def _prefix_each(prefix: str) -> Callable[[str], str | None]:
    def transform(text: str) -> str | None:
        """Skipped for a pasted JSON document: no launcher prefixes the lines of a file a user opened."""
        if is_json_document(text):
            return None
        return _join([prefix + line for line in _lines(text)])
    return transform


def fence(text: str) -> str:
    return "```\n" + text.rstrip("\n") + "\n```\n"


def quote(text: str) -> str:
    return _join(["> " + line if line else ">" for line in _lines(text)])


def details(text: str) -> str:
    return "<details><summary>log</summary>\n\n" + fence(text) + "\n</details>\n"


def crlf(text: str) -> str:
    return "\r\n".join(_lines(text)) + "\r\n"


_KEY = re.compile(r"([A-Za-z_][\w/.@-]*)(?=['\"]?\s*[:=])")
_NUMBER_TOKEN = re.compile(r"(?<![\w.])(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|nan|inf)(?![\w.])")


def ansi(text: str) -> str | None:
    """Colour codes around keys and numbers of metric lines (rich / loguru consoles). Skipped for a pasted
    JSON document."""
    if is_json_document(text):
        return None
    out = []
    for line in _lines(text):
        if is_metric_line(line):
            line = _KEY.sub(lambda m: f"\x1b[1m{m.group(1)}\x1b[0m", line)
            line = _NUMBER_TOKEN.sub(lambda m: f"\x1b[32m{m.group(1)}\x1b[0m", line)
        out.append(line)
    return _join(out)


def trailing_spaces(text: str) -> str:
    return _join([line + "   " for line in _lines(text)])


def tabs(text: str) -> str | None:
    """`key: value` with a tab after the colon, on lines other than a library's fixed message (DeepSpeed's
    `Attempted loss scale: 65536`, FastChat's `tokenization mismatch: 132 vs. 124`: no capture or paste
    changes the spaces inside those). Skipped where no line has ': '."""
    from lossguard.sources.patterns import EVENT_PATTERNS

    if ": " not in text:
        return None
    messages = [pattern for _, pattern in EVENT_PATTERNS]
    return _join([line if any(p.search(line.encode()) for p in messages) else line.replace(": ", ":\t")
                  for line in _lines(text)])


_NOISE_BLOCKS = (
    ["Map:  45%|████▌     | 450/1000 [00:01<00:01, 402.17 examples/s]"],
    ["[INFO|trainer.py:3984] 2024-05-01 10:00:00,123 >> Saving model checkpoint to output/checkpoint-500"],
    ["/usr/lib/python3.10/site-packages/torch/utils/checkpoint.py:91: UserWarning: None of the inputs have "
     "requires_grad=True. Gradients will be None", "  warnings.warn("],
    ["", ""],
    ["Loading checkpoint shards: 100%|██████████| 2/2 [00:03<00:00,  1.52s/it]"],
    ["Exception ignored in: <function _MultiProcessingDataLoaderIter.__del__ at 0x7f2c1c0b1e10>",
     "Traceback (most recent call last):",
     '  File "/usr/lib/python3.10/site-packages/wandb/sdk/lib/service_connection.py", line 61, in _teardown',
     "    self._router.join()",
     "BrokenPipeError: [Errno 32] Broken pipe"],
)


def noise(text: str) -> str | None:
    """A block of noise (a datasets map bar, an INFO line, a Python warning, blank lines, a checkpoint
    loading bar, an unrelated teardown traceback) after every metric line, in turn. Skipped for a pasted
    JSON document."""
    if is_json_document(text):
        return None
    out, at = [], 0
    for line in _lines(text):
        out.append(line)
        if is_metric_line(line):
            out.extend(_NOISE_BLOCKS[at % len(_NOISE_BLOCKS)])
            at += 1
    return _join(out)


def duplicate(host_prefixes: bool) -> Callable[[str], str | None]:
    def transform(text: str) -> str | None:
        """Every metric line printed by a second node (`log_on_each_node`), right after the first node's.
        Skipped for a pasted JSON document."""
        if is_json_document(text):
            return None
        first, second = ("10.0.0.1: ", "10.0.0.2: ") if host_prefixes else ("", "")
        out = []
        for line in _lines(text):
            out.append(first + line)
            if is_metric_line(line):
                out.append(second + line)
        return _join(out)
    return transform


def drop_head(share: float, evidence_start: int | None) -> Callable[[str], str | None]:
    """The first `share` of the lines cut off (a user pastes the middle). `evidence_start` is the index of
    the first line of the evidence for the original log's problem (None: healthy, nothing to keep)."""
    def transform(text: str) -> str | None:
        """Skipped for logs under 8 lines (nothing to cut), a pasted JSON document (a cut one is no longer
        one), and where the cut would reach the evidence of the problem."""
        lines = _lines(text)
        cut = int(len(lines) * share)
        if len(lines) < 8 or is_json_document(text) or cut == 0:
            return None
        if evidence_start is not None and cut > evidence_start:
            return None
        return _join(lines[cut:])
    return transform


_HF_DICT = re.compile(r"^\s*\{'[^']+': ")
_HF_FLOAT = re.compile(r"('[^']+': )(-?\d+\.\d*(?:[eE][-+]?\d+)?|-?\d+[eE][-+]?\d+|nan|-?inf)(?=[,}])")
_HF_QUOTED = re.compile(r"('[^']+': )'(-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|nan|-?inf)'(?=[,}])")


def hf_quoting(text: str) -> str | None:
    """transformers 5 prints a log dict's floats as `'{v:.4g}'` strings, 4.x as bare floats: switch each
    HF dict line to the other form. Skipped where the log has no HF dict line."""
    lines = _lines(text)
    if not any(_HF_DICT.match(line) for line in lines):
        return None
    out = []
    for line in lines:
        if _HF_DICT.match(line):
            if _HF_QUOTED.search(line):
                line = _HF_QUOTED.sub(r"\1\2", line)
            else:
                line = _HF_FLOAT.sub(lambda m: f"{m.group(1)}'{float(m.group(2)):.4g}'", line)
        out.append(line)
    return _join(out)


TRANSFORMS: dict[str, Callable[[str], str | None]] = {
    "timestamp": _prefix_each("2024-05-01 10:00:00,123 - INFO - "),
    "rank0": _prefix_each("[rank0]:"),
    "node0": _prefix_each("0: "),
    "host": _prefix_each("10.0.0.1: "),
    "torchrun": _prefix_each("[default0]:"),
    "fence": fence,
    "quote": quote,
    "details": details,
    "crlf": crlf,
    "ansi": ansi,
    "trailing": trailing_spaces,
    "tabs": tabs,
    "noise": noise,
    "dup": duplicate(host_prefixes=False),
    "dup_hosts": duplicate(host_prefixes=True),
    "hf_quoting": hf_quoting,
}
DROP_SHARES = {"drop10": 0.1, "drop20": 0.2, "drop30": 0.3}
NAMES = (*TRANSFORMS, *DROP_SHARES)
