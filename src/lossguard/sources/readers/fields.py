"""`Fields`: what a reader found on one line, before any step is placed (see `sources/placer.py`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from lossguard.core.records import EVAL, EVENT, TRAIN

__all__ = ["EVAL", "EVENT", "TRAIN", "Fields", "Form"]


class Form:
    """Which reader made the fields: step placement differs by format (a log dict names no step and follows
    the last one; a Megatron line always names its iteration; an event belongs to the step being taken)."""

    LOG_DICT = "log-dict"  # HF Trainer's `{'loss': 2.3, ...}`
    DS_STEP = "ds-step"  # DeepSpeed's `step=10, skipped=0, lr=[...]`
    EVENT = "event"  # a tell-tale warning (OVERFLOW, tokenization mismatch, ...)
    FACTS = "facts"  # the DeepSpeed banner and config dump
    GUARD = "guard"  # lossguard's own live findings and halt, printed into the job's log
    MEGATRON = "megatron"  # ` iteration 10/ 100 | ... | lm loss: 2.3 |`
    MMENGINE = "mmengine"  # `Epoch(train) [1][ 10/100]  lr: ... loss: ...`
    PLAIN = "plain"  # a script's own `step 6 loss 3.21` / nanoGPT's `iter 100: loss 2.34`
    GENERIC = "generic"  # any other `name <sep> number` pairs and progress counters (sources/readers/generic.py)
    SUMMARY_HEADER = "summary-header"  # `wandb: Run summary:`, `***** train metrics *****`
    EVAL_HEADER = "eval-header"  # `***** Evaluating perplexity *****`: the next metric line is the evaluation's


@dataclass(slots=True)
class Fields:
    form: str
    signals: dict[str, float] = field(default_factory=dict)
    step: int | None = None  # the step the line names itself
    kind: str = TRAIN  # TRAIN, EVAL or EVENT
    event: str | None = None  # an EVENT's name
    data: dict = field(default_factory=dict)  # an EVENT's data
    rank: int | None = None  # the rank the line names (`[rank1]: step 3 loss ...`)
    # Where a step can come from when the line names none:
    bar: int | None = None  # steps done on a running training bar before the event or dict (sources/progress.py)
    counter: tuple[int, int] | None = None  # a progress counter `i/N` (generic reader; tqdm before a dict)
    epoch: int | None = None  # a whole epoch number next to the counter (`Epoch 2/3`, `Epoch: [1]`)
    epochs: int | None = None  # N of an epoch written `e/N`: such an epoch may count from 1
    # The counter came with a step's name (`[step=5/739328]`, `[batch=5/100]`): a step even on a line of its
    # own, where a bare `3/3` (a loading bar) is none.
    named_counter: bool = False
    summary: bool = False  # a run-end total (HF's `train_runtime` dict): no step's values
    is_eval: bool = False  # the line says it is an evaluation (a word before its pairs, an eval key)
    # A log dict's text: a later dict with the same text is another node's copy (`log_on_each_node`).
    text: bytes | None = None
    open: bool = False  # a log dict the line ends before closing (wrapped by the terminal, or cut)
    estimate: bool = False  # train values estimated at an evaluation (nanoGPT's `train loss X, val loss Y`)
    loss_rank: int = 9  # the rank of the loss column read so far (sources/vocabulary.py `_loss_rank`)
    names: set[bytes] = field(default_factory=set)  # the keys read into this segment (generic reader)

    def has_metric(self) -> bool:
        """The fields hold a signal other than the epoch (not only a step or an epoch counter)."""
        return len(self.signals) > ("epoch" in self.signals)

    def resolved_step(self, first_epoch: int = 0, epoch_length: int | None = None) -> int | None:
        """The step the line names, or its counter within its epoch placed after the epochs before it
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
