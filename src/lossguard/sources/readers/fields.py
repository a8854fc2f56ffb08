"""`Fields`: what a reader found on one line, before any step is placed (see `sources/placer.py`)."""

from __future__ import annotations

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
    DARKNET = "darknet"  # ` 1000: 2.34, 2.45 avg loss, 0.001 rate, ...`: the iteration is the step
    KERAS = "keras"  # `Epoch 4/10`, then `1875/1875 [=====] - 5s 3ms/step - loss: ...`: the epoch numbers it
    TIMM = "timm"  # `Train: 0 [  50/1251 (  4%)]  Loss: 6.912 (6.93) ...`: epoch * N + i is the step
    PLAIN = "plain"  # a script's own `step 6 loss 3.21` / nanoGPT's `iter 100: loss 2.34`
    GENERIC = "generic"  # any other `name <sep> number` pairs and progress counters (sources/readers/generic.py)
    SUMMARY_HEADER = "summary-header"  # `wandb: Run summary:`, `***** train metrics *****`
    EVAL_HEADER = "eval-header"  # `***** Evaluating perplexity *****`: the next metric line is the evaluation's


class Fields:
    """What one line (or one part of it: a dict, a progress-bar redraw) says. A plain class whose rarely set
    attributes default at class level: a reader makes one per metric line, and setting four attributes costs
    a third of what a twenty-field dataclass's `__init__` does."""

    # Set by every reader:
    form: str  # which reader made it (`Form`)
    signals: dict[str, float]
    step: int | None  # the step the line names itself
    kind: str  # TRAIN, EVAL or EVENT
    # Set where the format has them:
    event: str | None = None  # an EVENT's name
    data: dict | None = None  # an EVENT's data
    rank: int | None = None  # the rank the line names (`[rank1]: step 3 loss ...`)
    bar: int | None = None  # steps done on a running training bar before the event (sources/progress.py)
    before: bytes = b""  # an EVENT's line up to the event: a progress bar redraw whose postfix holds metrics
    counter: tuple[int, int] | None = None  # a progress counter `i/N` (generic reader; tqdm before a dict)
    epoch: int | None = None  # a whole epoch number next to the counter (`Epoch 2/3`, `Epoch: [1]`)
    epochs: int | None = None  # N of an epoch written `e/N`: such an epoch may count from 1
    # The counter came with a step's name (`[step=5/739328]`, `[batch=5/100]`): a step even on a line of its
    # own, where a bare `3/3` (a loading bar) is none.
    named_counter: bool = False
    summary: bool = False  # a run-end total (HF's `train_runtime` dict): no step's values
    is_eval: bool = False  # the line says it is an evaluation (a word before its pairs, an eval step)
    # A log dict's text: a later dict with the same text is another node's copy (`log_on_each_node`).
    text: bytes | None = None
    open: bool = False  # a log dict the line ends before closing (wrapped by the terminal, or cut)
    estimate: bool = False  # train values estimated at an evaluation (nanoGPT's `train loss X, val loss Y`)
    loss_rank: int = 9  # the rank of the loss column read so far (sources/vocabulary.py `_loss_rank`)

    def __init__(self, form: str, signals: dict[str, float] | None = None, step: int | None = None,
                 kind: str = TRAIN) -> None:
        # The other attributes are set after construction, where a reader has them: a `**rare` argument
        # would double the cost of every metric line's fields.
        self.form = form
        self.signals = {} if signals is None else signals
        self.step = step
        self.kind = kind

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"Fields({shown})"

    @classmethod
    def event_of(cls, form: str, name: str, data: dict, step: int | None = None, bar: int | None = None) -> Fields:
        """The fields of an event line: its name and data, the step the line names, a bar on it."""
        fields = cls(form, None, step, EVENT)
        fields.event, fields.data, fields.bar = name, data, bar
        return fields

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
