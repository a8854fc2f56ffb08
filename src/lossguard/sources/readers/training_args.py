"""Run facts from the transformers `TrainingArguments` a training script prints at start: the whole repr on
one line, or one `name=value,` per line (its pretty form). Only the settings a cause's mechanism needs: the
precision and gradient checkpointing. A printed `False` is a fact too: it rules causes out.

    >>> read(b"bf16=False,").data
    {'bf16': False}
    >>> read(b"TrainingArguments(_n_gpu=1, bf16=True, fp16=False, gradient_checkpointing=True)").data
    {'bf16': True, 'fp16': False, 'gradient_checkpointing': True}
    >>> read(b"bf16_full_eval=False,") is None
    True
    >>> read(b"loss 2.3") is None
    True
"""

from __future__ import annotations

import re

from lossguard.sources.readers.fields import Fields, Form

_ARGUMENT = re.compile(rb"(?<![\w.])(bf16|fp16|gradient_checkpointing)=(True|False)\b")


def read(line: bytes) -> Fields | None:
    facts = {m.group(1).decode(): m.group(2) == b"True" for m in _ARGUMENT.finditer(line)}
    return Fields.event_of(Form.FACTS, "facts", facts) if facts else None
