"""Which settings a death blames: an arm is a fix only when it changes one of them. Pure data.

Surviving is not enough. An arm can survive by chance (the death does not repeat) or by changing something
that cannot touch the mechanism: `steps_per_print` cannot stop a NaN or bring replicas back in sync. Each
signature names the config sections its mechanisms live in (the known-issues table's causes for it: precision and
overflow handling, the ZeRO partitioning and its communication, clipping, optimizer and schedule); a change
under one of them is on the blamed setting. A crash blames the keys its own error line names (DeepSpeed's
config validation names the field it rejected). A signature with no config section (masked labels: the data)
blames nothing, so no config arm is recommended for it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

PRECISION = ("bf16", "fp16", "amp", "torch_autocast", "data_types", "communication_data_type")
ZERO = ("zero_optimization", "communication_data_type", "prescale_gradients", "gradient_predivide_factor",
        "sparse_gradients")
UPDATE = ("optimizer", "scheduler", "gradient_clipping")

BLAMED: dict[str, tuple[str, ...]] = {
    "nonfinite": PRECISION + ZERO + UPDATE,
    "nonfinite-hidden": PRECISION + ZERO + UPDATE,
    "fp16-overflow": PRECISION + ZERO + UPDATE,
    "zero-loss": PRECISION + ZERO + UPDATE,
    "divergence": PRECISION + UPDATE + ("zero_optimization",),
    "loss-spike": PRECISION + UPDATE,
    "rank-desync": ZERO + PRECISION,
    "no-grad-flow": ZERO + PRECISION + ("activation_checkpointing",),
    "not-learning": ZERO + PRECISION + UPDATE,
    "lr-zero": UPDATE,
    "timeout": ZERO + ("comms_logger",),  # a hang: the collectives and how ZeRO schedules them
    "masked-labels": (),  # the data and its template, not the DeepSpeed config
}


def blamed_sections(signature: str | None) -> tuple[str, ...]:
    """The config sections a death with `signature` blames (dotted prefixes)."""
    return BLAMED.get(signature or "", ())


def changes_blamed(changes: Iterable[str], signature: str | None, crash: str | None = None) -> bool:
    """True when one of the changed dotted keys lies under a blamed section, or (a crash) is named by the
    crash's error line."""
    sections = blamed_sections(signature)
    for key in changes:
        if any(key == s or key.startswith(s + ".") for s in sections):
            return True
        if crash and _named(key, crash):
            return True
    return False


def describe(signature: str | None, crash: str | None = None) -> str:
    """`bf16, fp16, zero_optimization, ...` or `the keys its error line names`, for the verdict line."""
    sections = blamed_sections(signature)
    if sections:
        return ", ".join(dict.fromkeys(sections))
    return "the keys its error line names" if crash else "no config setting"


def _named(key: str, text: str) -> bool:
    leaf = key.rsplit(".", 1)[-1]
    return bool(re.search(rf"(?<![\w]){re.escape(leaf)}(?![\w])", text))
