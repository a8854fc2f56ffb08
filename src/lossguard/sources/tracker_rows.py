"""What experiment trackers (MLflow, W&B) hold, as records: numbers by key at a step, and the run's params.

Both trackers store what the training loop logged under its own key names (the HF Trainer's callbacks log
`loss` / `eval_loss` to MLflow and `train/loss` / `eval/loss` to W&B); the shared vocabulary
(`generic.column_name`) maps them to signals, so a tracker needs no key table of its own.
"""

from __future__ import annotations

from lossguard.core.dsconfig import as_bool, as_int
from lossguard.core.records import EVAL, EVENT, TRAIN, Record
from lossguard.sources.vocabulary import column_name, put_loss

# The Trainer's end-of-training summary, logged at the last step beside that step's own numbers (MLflow
# stores both at one step): its `train_loss` is the run's mean loss, never the last step's loss.
SUMMARY_KEYS = frozenset({"train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss",
                          "total_flos"})
# The Trainer's arguments (logged as MLflow params / W&B config) that are run facts (`core.facts.RunFacts`).
_FACTS = {"bf16": as_bool, "fp16": as_bool, "gradient_checkpointing": as_bool,
          "gradient_accumulation_steps": as_int, "transformers_version": lambda v: str(v) if v else None}


def step_records(step: int, values: dict[str, float], source: str) -> list[Record]:
    """The numbers logged at one step (tracker key -> value) as records: the training signals, an EVAL record
    when an evaluation loss is among them, and the Trainer's summary as a `train-summary` event."""
    out = []
    if "train_runtime" in values:
        summary = {k: v for k, v in values.items() if k in SUMMARY_KEYS}
        out.append(Record(step=step, kind=EVENT, event="train-summary", source=source, data=summary))
        values = {k: v for k, v in values.items() if k not in SUMMARY_KEYS}
    signals: dict[str, float] = {}
    for key, value in values.items():
        name = column_name(key)
        if name == "loss":
            put_loss(signals, value, preferred="loss" not in signals or key in ("loss", "train/loss"))
        elif name not in (None, "step"):
            signals[name] = value
    eval_loss = signals.pop("eval_loss", None)
    if signals.keys() - {"epoch"}:
        out.append(Record(step=step, signals=signals, kind=TRAIN, source=source))
    if eval_loss is not None:
        evaluation = {"eval_loss": eval_loss, **({"epoch": signals["epoch"]} if "epoch" in signals else {})}
        out.append(Record(step=step, signals=evaluation, kind=EVAL, source=source))
    return out


def facts_record(params: dict[str, object], source: str) -> Record | None:
    """The run facts among a run's params (the Trainer's arguments), as the `facts` event every reader emits."""
    facts = {}
    for key, parse in _FACTS.items():
        if key in params and (value := parse(params[key])) is not None:
            facts[key] = value
    return Record(step=None, kind=EVENT, event="facts", data=facts, source=source) if facts else None


def number(value: object) -> float | None:
    """A logged value as a float: ints and floats, and the strings JSON writers use for NaN and +-Inf."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and value in ("NaN", "nan", "Infinity", "-Infinity", "inf", "-inf"):
        return float(value.replace("Infinity", "inf"))
    return None
