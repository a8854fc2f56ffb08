"""Tell-tale log strings (the warnings and messages the known issues print), compiled once. Bytes patterns: the text source scans bytes.

Each entry maps a regex to the event name it becomes. The numeric formats (HF dicts, DeepSpeed
`step=` lines, Megatron, mmengine) are parsed in `text_log.py`.
"""

from __future__ import annotations

import re

# Warnings and messages that become tagged events. Group 1.. feed the event's data (see text_log).
EVENT_PATTERNS: list[tuple[str, re.Pattern[bytes]]] = [
    ("overflow", re.compile(
        rb"\[deep(?:speed|scale)\] OVERFLOW! (?:Rank (\d+) )?Skipping step\.?"
        rb"(?: Attempted loss scale: (\d+(?:\.\d+)?), reducing to (\d+(?:\.\d+)?))?")),
    # Older DeepSpeed fp16 optimizers (fused_optimizer, unfused), plain PyTorch fp16 wrappers and fairseq.
    ("overflow", re.compile(
        rb"(?:Overflow detected\. Skipping step\. Attempted loss scale: (?P<attempted>\d+(?:\.\d+)?)"
        rb"(?:, reducing to (?P<new>\d+(?:\.\d+)?))?|"
        rb"Grad overflow on iteration|fp16 dynamic loss scale overflow! Skipping step|"
        rb"overflow detected, (?:ignoring gradient, )?setting loss scale to: (?P<set_to>[0-9][0-9.eE+-]*))")),
    # DeepSpeed's floor (min_loss_scale, 1 by default: "reducing to 1" from 1, "from 1 to 1"), fairseq's.
    ("scale-at-minimum", re.compile(
        rb"Current loss scale already at minimum|Attempted loss scale: 1, reducing to 1\b|"
        rb"Reducing dynamic loss scale from 1 to 1\b|Minimum loss scale reached")),
    ("tokenization-mismatch", re.compile(rb"tokenization mismatch: (\d+) vs\. (\d+)")),
    ("lr-before-step", re.compile(
        rb"tried to get lr value before scheduler/optimizer started stepping|"
        rb"Attempting to get learning rate from scheduler before it has started")),
    ("no-input-grad", re.compile(rb"None of the inputs have requires_grad=True")),
    ("reentrant-checkpoint", re.compile(rb"the use_reentrant parameter should be passed explicitly")),
    ("response-key-missing", re.compile(rb"Could not find response (?:key|template)")),
    # The same TRL warning's last sentence: the instance text it quotes spans lines, so a paste can keep
    # only this line of it.
    ("response-key-missing", re.compile(rb"This instance will be ignored in loss calculation")),
    ("trainable-params", re.compile(rb"Number of trainable parameters = ([\d,]+)")),
    # Bounded gap: an unbounded `.*` costs a scan to the line's end per occurrence of the first phrase.
    ("image-token-mismatch", re.compile(rb"must match the size of tensor b.{0,2048}?vit_embeds\.shape")),
    ("nonfinite-detected", re.compile(rb"Detected inf/nan during batch_number=(\d+)")),
    ("cudnn-sdpa", re.compile(rb"cuDNN SDPA backward got grad_output\.strides\(\) != output\.strides\(\)")),
]

# A literal every match of the pattern contains: `needle in line` is far cheaper than a regex search,
# so a line meets only the patterns it could match.
EVENT_NEEDLES: list[tuple[bytes, str, re.Pattern[bytes]]] = [
    (needle, name, pattern) for needle, (name, pattern) in zip(
        (b"OVERFLOW", b"verflow", b"loss scale", b"tokenization mismatch", b"lr", b"requires_grad",
         b"use_reentrant", b"Could not find response", b"will be ignored in loss", b"trainable parameters", b"tensor b", b"inf/nan",
         b"cuDNN SDPA"), EVENT_PATTERNS)
]

# Fast pre-filter: a line is parsed only if it contains one of these fixed strings. Everything the
# parsers and EVENT_PATTERNS need must have its anchor here. Fixed strings (not regexes) so that
# grep does the scan when it is available, with these as one extended regex (see scan.iter_grep_lines).
ANCHOR_STRINGS: tuple[str, ...] = (
    "{'", '{"', "OVERFLOW", "Overflow", "overflow", "loss scale", "skipped=", "mismatch", "requires_grad",
    "lr value", "learning rate", "response key", "response template", "trainable parameters",
    "DeepSpeed info", "zero_config", "_enabled ..", "_config ..", "communication_data_type", "iteration ",
    "Epoch(", "Iter(", "Iter [", "tensor b", "inf/nan", "cuDNN SDPA", "use_reentrant", "ZeRO stage", "world_size",
    "WORLD INFO", "zero_optimization_stage", "bf16=", "fp16=", "gradient_checkpointing=", "gradient_accumulation_steps ..", "step ", "iter ",
    # The generic metric reader (sources/readers/generic.py): any loss-like name, the grad norm and LR names that
    # come on lines of their own, and a bare printed loss tensor.
    "loss", "Loss", "LOSS", "grad_norm", "gnorm", "grad norm", "learning_rate", "tensor(",
    # Lines of their own that head a block of metric lines (OLMo's `[step=5/739328,epoch=0]`, Composer's
    # `[batch=5/100]:`), and Lightning's / Composer's LR names (`lr-AdamW`, `lr-DecoupledAdamW/group0`).
    "[step=", "[batch=", "lr-",
    # Keras's `Epoch 4/10` above the epoch's progress bar (sources/readers/keras.py).
    "Epoch ",
    # darknet's iteration line (`1: 719.3, 719.3 avg, 0.001 rate, ...` names no loss in pjreddie's version).
    " rate, ",
    # Lines that say what the metric lines after them are (text_log._header): a run summary block, an
    # evaluation announced on a line of its own (`***** Evaluating perplexity *****`).
    "Run summary", "metrics *****", "valuat", "alidat",
    # A line with terminal colour codes: they can split any anchor above (`\x1b[1mstep\x1b[0m 5`).
    "\x1b[",
)


def _trie_pattern(words: list[bytes]) -> bytes:
    """One regex that matches where any of `words` starts, written as a trie (`O(?:VERFLOW|verflow)|...`):
    at each position Python's regex engine then tries the one branch for that byte, not every word, which
    halves the scan `watch` (and `analyze` on stdin) runs over every byte of output."""
    trie: dict = {}
    for word in words:
        node = trie
        for byte in word:
            node = node.setdefault(byte, {})
        node[None] = True  # a word ends here: a match of it is enough, longer words need not be tried

    def branch(node: dict) -> bytes:
        if None in node:
            return b""
        alternatives = [re.escape(bytes([byte])) + branch(child) for byte, child in sorted(node.items())]
        return alternatives[0] if len(alternatives) == 1 else b"(?:" + b"|".join(alternatives) + b")"

    return branch(trie)


ANCHORS = re.compile(_trie_pattern([a.encode() for a in ANCHOR_STRINGS]))

HF_PAIR = re.compile(rb"""['"]([^'"]+)['"]\s*:\s*('[^']*'|"[^"]*"|[^,}]+)""")
TQDM_COUNTER = re.compile(rb"(?<!\d)(\d+)/(\d+) \[")
# step, skipped, and the first param group's lr (the catalog's lr).
DS_STEP = re.compile(rb"\bstep=(\d+), skipped=(\d+), lr=\[([^,\]]*)(?:,[^\]]*)?\]")
DS_VERSION = re.compile(rb"DeepSpeed info: version=([0-9][\w.+-]*)")
DS_ZERO_OPT = re.compile(rb"Creating (torch\.\w+) ZeRO stage (\d) optimizer")
DS_DUMP_LINE = re.compile(rb"^\s*(\w+) \.{2,} (.*)$")  # the value is rstripped by its reader
DS_WORLD = re.compile(rb"dist_world_size=(\d+)")
DS_WORLD_INFO = re.compile(rb"WORLD INFO DICT: (\{.*)")  # cut at the last `}` by its reader: one scan
KV_ASSIGN = re.compile(rb"(?<!\w)(\w+)=([^\s,]+)")
MEGATRON = re.compile(rb"\biteration\s+(\d+)\s*/\s*\d+\s*\|")
MEGATRON_FIELD = re.compile(rb"\|\s*([a-z][a-z0-9_()/-]*(?: +[a-z0-9_()/-]+)*)\s*:\s*([-+0-9.eEnaNinfINF]+)")
# mmengine's `Epoch(train) [1][ 10/100]` and its predecessor mmcv's `Epoch [1][ 10/100]` / `Iter [10/100]`.
# mmcv's epoch is always `[e]` before the counter: ColossalAI's `Epoch [1/3]` is an epoch counter, no iteration.
MMENGINE = re.compile(rb"(Epoch|Iter)(?:\((train|val)\)\s*(?:\[(\d+)\]\s*)?|(?<=Epoch) \[(\d+)\]|(?<=Iter) )"
                      rb"\[\s*(\d+)\s*/\s*(\d+)\]")
MMENGINE_FIELD = re.compile(rb"(?<![\w./])([a-z][\w./]*):\s+(-?[0-9][0-9.eE+-]*|-?nan|-?inf)\b")
# A user script's own lines: `step 6 loss 3.21 grad_norm 1.70`, `[rank1] step 3 loss ... param_sum ...`,
# nanoGPT's `iter 100: loss 2.3456, time 12.3ms, mfu 4.1%`.
PLAIN_STEP = re.compile(rb"(?:\[rank(\d+)\]:?\s*)?\b(?:step|iter)\s+(\d+)(?:\s*[:,|])?\s+(?=[A-Za-z_])")
# A split word before the name says which data the value is of: nanoGPT's `step 3000: train loss 2.81, val loss
# 2.93`, litgpt's `iter 8: val loss 1.64`.
PLAIN_FIELD = re.compile(rb"(?<![\w/])\d*(?:(train|val|valid|validation|eval|test)\s+)?([A-Za-z_][\w/]*)\s*(?:[:=]\s*)?"
                         rb"(-?\d[\d.]*(?:[eE][+-]?\d+)?|nan|-?inf)(?![\w.])")
