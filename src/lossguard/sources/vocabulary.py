"""What a logged key means: the one table every source reads keys through.

`core/signals.py` names the signals lossguard tracks and the aliases tools give them (`train/loss`,
`learning_rate`, `gnorm`). This module adds what a key says about the record it is on: a step counter
(`step`, `global_step`, fairseq's `num_updates`), an epoch, an evaluation's value (`eval_*`, `val_loss`), a
run-end total (`train_runtime`), a loss column and how much to trust it. Text lines, log dicts, JSON lines,
CSV and table columns, TensorBoard tags and tracker metrics all ask `meaning(key)`, so a key means one thing
in every format.
"""

from __future__ import annotations

import math
import re
from enum import IntEnum
from typing import NamedTuple

from lossguard.core.signals import canonical, to_float


class Role(IntEnum):
    """What a key's value is, as the line readers use it."""

    SKIP = 0  # of no interest (`time`, `mfu`, `tokens`)
    SIGNAL = 1  # a tracked signal other than a loss (grad norm, LR, loss scale, reward ...)
    LOSS = 2  # a training loss column (`loss`, `train_loss`, `lm loss`, `nll_loss`)
    EVAL_LOSS = 3  # an evaluation's loss (`eval_loss`, `val loss`, `valid_loss`)
    STEP = 4  # the optimizer step counter
    EPOCH = 5  # the epoch (fractional or whole)
    BATCH = 6  # Composer's `[batch=5/100]`: a position that heads a block of metric lines
    EVAL_STEP = 7  # the step of an evaluation (`validate step: 10`): the line's loss is an eval loss


class Meaning(NamedTuple):
    role: Role
    name: str | None  # the record key it feeds: a signal name, "loss", "eval_loss", "epoch"; None if none
    loss_rank: int  # of several loss columns the lowest rank is the loss (see `_loss_rank`)
    catalog: str | None  # the signal-table name of the exact key (`core.signals.canonical`)
    evaluation: bool  # the key names an evaluation's value: its record is an evaluation
    summary: bool  # a run-end total (`train_runtime`): its record describes the run, not a step
    step_of_total: bool  # `global_step/max_steps` (ms-swift): a "5/100" string whose first part is the step


# Step counters, in the order a row holding several is read by (`step` before `global_step` ...).
STEP_NAMES: tuple[str, ...] = (
    "step", "global_step", "iteration", "iter", "current_steps", "train/global_step", "trainer/global_step",
    "num_updates", "global_steps", "steps", "global step")
_STEP_SET = frozenset(STEP_NAMES)
STEP_OF_TOTAL = "global_step/max_steps"
SUMMARY_KEYS = frozenset({"train_runtime"})
# `epoch`, `train epoch`, `training_epoch`, `train/epoch`.
_EPOCH_NAME = re.compile(r"(?:train(?:ing)?[ _/])?epoch")
# A step named in two words: MaxText's `completed step: 6`, `train step 12`, `optimizer step: 40`. Singular only:
# `Total optimization steps = 1000` and `training steps: 500` are totals, not the current step.
_STEP_PHRASE = re.compile(r"(?:completed|current|train|optimizer|global|update) (?:step|iter|iteration)")
# The step of an evaluation line (torchtitan's `validate step: 10  loss: 5.21`): its loss is an eval loss.
_EVAL_STEP_PHRASE = re.compile(r"(?:validate|validation|valid|val|eval|evaluation) (?:step|iter|iteration)")
_EVAL_PREFIXES = ("eval_", "eval/")

_MEANINGS: dict[bytes | str, Meaning] = {}


def meaning(raw: bytes | str) -> Meaning:
    """What the key `raw` means, computed once per distinct key: a big log repeats a handful of keys
    millions of times."""
    found = _MEANINGS.get(raw)
    if found is None:
        key = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        found = _MEANINGS[raw] = _meaning(key)
    return found


def _meaning(key: str) -> Meaning:
    catalog = canonical(key)
    role, name, rank = _role(key.strip().lower())
    evaluation = key.startswith(_EVAL_PREFIXES) or catalog == "eval_loss"
    return Meaning(role, name, rank, catalog, evaluation, key in SUMMARY_KEYS, key == STEP_OF_TOTAL)


def _role(key: str) -> tuple[Role, str | None, int]:
    if key in _STEP_SET or _STEP_PHRASE.fullmatch(key):
        return Role.STEP, None, 0
    if _EVAL_STEP_PHRASE.fullmatch(key):
        return Role.EVAL_STEP, None, 0
    if key.startswith("train ") and (rest := _role(key[6:]))[0] == Role.SIGNAL:
        return rest  # Composer's `Train lr-DecoupledAdamW/group0: 1e-05` (its loss is read by the loss rule)
    if key == "batch":  # Composer's `[batch=5/100]:` heads a block of metric lines; a bare `batch 8` is no step
        return Role.BATCH, None, 0
    if _EPOCH_NAME.fullmatch(key):
        return Role.EPOCH, "epoch", 0
    name = canonical(key)
    if name == "loss":
        return Role.LOSS, "loss", _loss_rank(key, 1)
    if name == "eval_loss":
        return Role.EVAL_LOSS, name, 0
    if name is not None:
        return Role.SIGNAL, name, 0
    if "loss" not in key or "@" in key or "scale" in key or key.startswith("predict"):
        return Role.SKIP, None, 0
    if key.startswith(("eval", "val", "valid", "test")):
        return Role.EVAL_LOSS, "eval_loss", 0
    return Role.LOSS, "loss", _loss_rank(key, 2)


def _loss_rank(key: str, otherwise: int) -> int:
    """Loss-like names rank: a name that says "train" (reduced_train_loss, Train loss) beats a bare `loss`
    (Lightning's progress-bar `loss` is a display running mean), which beats other *loss names (closs,
    act_loss, nll_loss: the first of those on the line wins)."""
    return 0 if "train" in key else otherwise


def is_step(key: str) -> bool:
    """A column or row key that holds the step counter."""
    return meaning(key).role == Role.STEP


def column_name(raw: str) -> str | None:
    """The record key a table column named `raw` feeds: "step", "epoch", "loss", "eval_loss", a signal
    name, or None (a column of no interest)."""
    found = meaning(raw)
    return "step" if found.role == Role.STEP else found.name


def row_step(row: dict) -> int | None:
    """The step of a `{key: value}` row (trainer_state, JSON lines, a tracker's history): its first step
    counter in `STEP_NAMES` order with a sane value, or the first part of `global_step/max_steps`."""
    for key in STEP_NAMES:
        if key in row:
            value = to_float(row[key])
            if value is not None and 0 <= value < 1e15:  # an inf or absurd step is no step
                return int(value)
    value = row.get(STEP_OF_TOTAL)
    return first_int(value) if isinstance(value, (str, bytes)) else None


def first_int(raw: str | bytes) -> int | None:
    """The step of a `5/100` value (quoted or not)."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    digits = text.strip("'\" ").split("/")[0]
    return int(digits) if digits.isdigit() else None


def put_loss(signals: dict[str, float], value: float, preferred: bool = True) -> None:
    """A loss column's value into a log's signals, where another loss column may be there already (`loss` and
    `lm_loss`, `train_loss` and `reduced_train_loss`): the preferred one is the loss; the other, when it is
    NaN/Inf, is kept as `other_loss`, so that a NaN in any loss column reaches the detectors (LOSS011) and a
    reader's choice of column never hides one. Every reader puts its loss columns through here."""
    present = signals.get("loss")
    if present is None:
        signals["loss"] = value
        return
    kept, other = (value, present) if preferred else (present, value)
    signals["loss"] = kept
    if other != other or other in (math.inf, -math.inf):
        signals["other_loss"] = other
