"""The facts a cause is ranked on, and how often a mechanism shows each: the vocabulary of the cause catalog.

A `Clue` is one yes/no question about a run (is ZeRO stage 1 or 2? did OVERFLOW lines appear? did the loss
blow up beside the first NaN gradient?), answered from the run's inputs or left unknown. Each cause states,
for the clues its mechanism says something about, how often a run with that cause shows the clue: `ALWAYS`
(the mechanism needs it), `OFTEN`, `RARELY`, `NEVER` (the mechanism excludes it). A cause that states
nothing about a clue shows it as often as runs in general do: the clue's `background`.

The ranking (diagnose/ranking.py) derives everything from these statements: a known clue counts for a cause
only as far as the cause predicts it more than its rivals for the same signature do; it decides for the
cause (the cap that allows "likely") only when the cause predicts it and every rival, and runs in general,
rarely do; it rules the cause out when the cause says ALWAYS and the clue is false, or NEVER and it is true.
There are no free multipliers: the four words are the only numbers.

A clue that defines a signature (OVERFLOW lines for an overflow storm, a sentinel grad norm for a hidden
NaN) names it in `symptom_of`: for that signature it counts for no cause, since every cause of the
signature shows it. That is what keeps a symptom from ever counting as its own cause.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from lossguard.knowledge.conditions import (
    OPS,
    AnyKnown,
    Column,
    EvalOnlyNonfinite,
    Event,
    Fact,
    Fired,
    Measured,
    OnsetAtStart,
    RunEvidence,
    RunNumber,
    SteadyBeforeOnset,
    Subject,
    compare,
)
from lossguard.knowledge.issue import VersionWindow

_VALUE = re.compile(r"\{value[^}]*\}")


@dataclass(frozen=True, slots=True)
class Level:
    """How often a mechanism shows a clue, as the chance that a run with that mechanism shows it. The four
    values are declared once, here: ALWAYS and NEVER are what a mechanism needs or excludes (so the
    opposite is nearly impossible), OFTEN and RARELY are tendencies."""

    word: str
    p: float

    def chance(self, holds: bool) -> float:
        return self.p if holds else 1.0 - self.p


ALWAYS = Level("always", 0.95)
OFTEN = Level("often", 0.6)
RARELY = Level("rarely", 0.15)
NEVER = Level("never", 0.02)
LEVELS = (ALWAYS, OFTEN, RARELY, NEVER)


@dataclass(frozen=True, slots=True)
class Clue:
    """One yes/no question about a run. `says` is shown when it holds, `says_not` when it is known not to
    (empty: a clue only ever seen holding, such as a log event, whose absence is unknown, not false);
    "{value}" in either is the value read. `background`: how often a run whose failure has some other
    cause shows it."""

    name: str
    subject: Subject
    op: str
    value: Any
    says: str
    says_not: str = ""
    background: Level = OFTEN
    symptom_of: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"clue {self.name}: unknown operator {self.op!r}; one of {sorted(OPS)}")

    def judge(self, run: RunEvidence) -> tuple[bool | None, Any]:
        """(holds?, the value read); None when the inputs do not tell."""
        actual = self.subject.read(run)
        if actual is None:
            return None, None
        holds = compare(self.op, actual, self.value)
        if holds is None or (not holds and not self.says_not):
            return None, actual  # a version the window cannot place; a positive-only clue seen false
        return holds, actual

    def explain(self, holds: bool, actual: Any, run: RunEvidence) -> str:
        origin = self.subject.origin(run)
        text = (self.says if holds else self.says_not).format(value=actual)
        return text + (f" [{origin}]" if origin else "")

    def describe(self) -> str:
        """The fact in words, as the report would state it (its value left open), for `lossguard explain` and
        docs/causes.md."""
        return _VALUE.sub("…", self.says)


def fact(name: str, op: str, value: Any, says: str, says_not: str, background: Level) -> Clue:
    return Clue(name, Fact(name), op, value, says, says_not, background)


def event(name: str, says: str, background: Level = RARELY, symptom_of: tuple[str, ...] = ()) -> Clue:
    return Clue(f"event:{name}", Event(name), ">=", 1, says, "", background, symptom_of)


def fired(code: str, says: str, background: Level = RARELY, symptom_of: tuple[str, ...] = ()) -> Clue:
    return Clue(code, Fired(code), "==", True, says, "", background, symptom_of)


def measured(code: str, key: str, op: str, value: float, says: str, says_not: str = "",
             background: Level = OFTEN, symptom_of: tuple[str, ...] = ()) -> Clue:
    return Clue(f"{code}.{key}{op}{value}", Measured(code, key), op, value, says, says_not, background, symptom_of)


@dataclass(frozen=True, slots=True)
class AnyWindow:
    """Several windows of one package read as one: in any of them."""

    windows: tuple[VersionWindow, ...]

    def contains(self, version: str | None) -> bool | None:
        hits = [w.contains(version) for w in self.windows]
        return None if None in hits else any(hits)

    @property
    def package(self) -> str:
        return self.windows[0].package

    @property
    def fact(self) -> str:
        return self.windows[0].fact

    def __str__(self) -> str:
        return " or ".join(str(w) for w in self.windows)


def in_window(name: str, window: VersionWindow | AnyWindow, why: str, background: Level = OFTEN) -> Clue:
    """The run's version of the window's package is in the window; `background`: how often runs in general
    use those releases (a window of a few releases is RARELY)."""
    label = "DeepSpeed" if window.package == "deepspeed" else window.package
    return Clue(name, Fact(window.fact), "inside", window,
                f"{label} {{value}} is in the affected range ({window}): {why}",
                f"{label} {{value}} is outside the affected range ({window})", background)


# --- The run's configuration --------------------------------------------------------------------------------
ZERO12 = fact("zero_stage", "in", [1, 2], "ZeRO stage {value}: a ZeRO-1/2 run",
              "ZeRO stage {value}: not ZeRO-1/2, so no ZeRO-1/2 gradient-reduction path", OFTEN)
OVERLAP = fact("overlap_comm", "==", True, "overlap_comm is true",
               "overlap_comm is false: the gradient reduction is serialised", RARELY)  # DeepSpeed's ZeRO-1/2 default
MULTI_RANK = fact("world_size", ">=", 2, "more than one rank ({value})", "a single rank: no gradient reduction between ranks",
                  OFTEN)
MULTI_RANK_BUCKET = fact("use_multi_rank_bucket_allreduce", "==", True, "use_multi_rank_bucket_allreduce is true",
                         "use_multi_rank_bucket_allreduce is false", OFTEN)
BF16 = fact("bf16", "==", True, "bf16 is on", "bf16 is off", OFTEN)
FP16 = fact("fp16", "==", True, "fp16 is on: activations above 65504 overflow and steps are skipped",
            "fp16 is off: no loss scale, no overflow skip", RARELY)
CHECK_OFF = fact("check_grad_overflow", "==", False, "bf16.check_grad_overflow is false",
                 "bf16.check_grad_overflow is true: a non-finite gradient skips the step", OFTEN)
CHECKPOINTING = fact("gradient_checkpointing", "==", True, "gradient checkpointing is on",
                     "gradient checkpointing is off", OFTEN)
CPU_TORCH = fact("torch_version", "endswith", "+cpu", "torch {value} is a CPU build: no cuDNN kernels",
                 "torch {value} is not a CPU build", RARELY)
# Anything that shows the run is a DeepSpeed ZeRO run: a version, a stage, a ZeRO setting, or grad_norm at
# ZeRO-1/2's sentinel for non-finite gradients. Known false only where the inputs show none of them, which a
# pasted excerpt often does not: runs in general rarely show them, DeepSpeed causes often do.
DEEPSPEED_SHOWN = Clue("deepspeed-shown", AnyKnown(("deepspeed_version", "zero_stage", "overlap_comm"),
                                                   (("GRAD001", "groups"), ("LOSS002", "sentinel_groups"))),
                       "found", True, "the inputs show a DeepSpeed ZeRO run",
                       "nothing in the inputs shows DeepSpeed ZeRO (no version, stage, ZeRO setting or "
                       "sentinel grad norm)", RARELY)
# The live guard on a PyTorch FSDP run (FSDP1 or FSDP2) says so: such a run has no DeepSpeed ZeRO in it, so a
# cause that needs DeepSpeed's code predicts it never. Positive-only: a log that does not say is not a no.
FSDP_SHOWN = Clue("fsdp-shown", Fact("sharding_engine"), "in", ("fsdp1", "fsdp2"),
                  "the live guard saw PyTorch FSDP shard the model ({value}): no DeepSpeed ZeRO in this run",
                  "", RARELY)

GA = fact("gradient_accumulation_steps", ">=", 2, "gradient accumulation over {value} micro-batches",
          "no gradient accumulation (gradient_accumulation_steps {value})", OFTEN)
ZERO2 = fact("zero_stage", "==", 2, "ZeRO stage 2", "ZeRO stage {value}, not 2", OFTEN)

# --- What the log shows -------------------------------------------------------------------------------------
SENTINEL = measured("GRAD001", "groups", ">=", 1, "grad_norm is pinned at DeepSpeed ZeRO's sqrt(k) sentinel for "
                    "non-finite gradients", background=OFTEN, symptom_of=("nonfinite-hidden",))
GRAD_FIRST = measured("LOSS001", "loss_finite", ">=", 1,
                      "the gradient went non-finite while the loss beside it was finite: the forward pass was fine",
                      "the loss itself went non-finite, with no non-finite gradient logged before it", OFTEN)
LOSS_EXPLODED = measured("LOSS001", "loss_exploded", ">=", 1, "the loss jumped more than tenfold beside the first "
                         "non-finite gradient norm: the update before it blew the weights up", background=RARELY)
ON_EVAL = Clue("eval-only-nonfinite", EvalOnlyNonfinite(), "==", True,
               "only the evaluation loss is non-finite: every training loss is finite and non-zero",
               "the training side shows the failure too (a non-finite value, or the 0.0 the Trainer's NaN filter "
               "prints for one)", RARELY)
ONSET_AT_START = Clue("onset-at-start", OnsetAtStart(), "==", True, "the trouble shows from the first logged step",
                      "the run was fine before the trouble began", OFTEN)  # a pasted excerpt often starts near it
STEADY_BEFORE = Clue("steady-before", SteadyBeforeOnset(), ">=", 3, "the loss was steady for {value} logs before "
                     "the failure, with no spike or rise", "", OFTEN)
SPIKE_BEFORE = fired("LOSS006", "a loss spike came before", RARELY, symptom_of=("loss-spike",))
DIVERGED_BEFORE = fired("LOSS005", "the loss diverged", RARELY, symptom_of=("divergence",))
OVERFLOW_LINES = event("overflow", "{value} loss-scale OVERFLOW lines", symptom_of=("fp16-overflow",))
SCALE_FLOOR = event("scale-at-minimum", "the loss scale hit its minimum", symptom_of=("fp16-overflow",))
LR_BEFORE_STEP = event("lr-before-step", "{value} warnings that the optimizer had not stepped yet: no step has been "
                       "taken", symptom_of=())
NORM_ZERO_LR_ZERO = Clue("zero-norm-at-zero-lr", RunNumber("zero_norm_at_zero_lr", "the lr and grad_norm columns"), "==", True,
                         "grad_norm is exactly 0.0 wherever the learning rate is 0: DeepSpeed returns before "
                         "computing the norm when it skips a step, so no step has been taken",
                         "grad_norm is non-zero where the learning rate is 0: gradients are computed and the "
                         "optimizer steps", RARELY)
LR_FROZEN = measured("LOSS002", "lr_frozen", ">=", 1, "the learning rate did not move when the loss turned 0.0: "
                     "the optimizer skipped the step", background=RARELY)
LR_IS_ZERO = fired("LR001", "the learning rate is 0", RARELY, symptom_of=("lr-zero",))
TOKENIZATION_MISMATCH = event("tokenization-mismatch", "{value} 'tokenization mismatch' warnings")
RESPONSE_KEY_MISSING = event("response-key-missing", "{value} 'Could not find response key' warnings")
# The warning is raised exactly when image tokens and image features disagree: no other cause prints it.
IMAGE_TOKEN_MISMATCH = event("image-token-mismatch", "{value} image-token mismatch warnings", NEVER)
MASKED_BATCHES = fired("LABEL001", "batches with no supervised token were logged", RARELY,
                       symptom_of=("masked-labels",))
# A Megatron-style line that drops its loss field (printed only when the interval's average is > 0): a NaN
# the loop applied without a check. A loop with a NaN check skips the step and says so instead.
LOSS_VANISHED = event("loss-field-vanished", "{value} iteration lines without their loss field: the loop applied a "
                      "NaN step without a NaN check")
NO_INPUT_GRAD = event("no-input-grad", "PyTorch warned 'None of the inputs have requires_grad=True'")
REENTRANT = event("reentrant-checkpoint", "a reentrant checkpointing warning")
NOT_IN_OPTIMIZER = event("trainable-not-in-optimizer", "parameters that train are not in the optimizer")
NO_TRAINABLE = fired("GRAD003", "the Trainer reports 0 trainable parameters")
CUDNN_SDPA = event("cudnn-sdpa", "a cuDNN SDPA backward warning in the log")
# LOSS007's eval_ratio: the eval loss over the first training loss once the training loss vanished.
# Leakage makes held-out data as easy as training data (the eval loss vanishes too: under a tenth of where
# the training loss began, five times memorisation's own 2%); overfitting leaves it high or rising. An easy
# task (short, templated answers) makes the eval loss vanish as well, so runs in general often show it: it
# never decides leakage on its own.
EVAL_VANISHED = measured("LOSS007", "eval_ratio", "<=", 0.1, "eval_loss vanished too ({value:.2f} of the initial "
                         "loss): held-out data is predicted as well as training data",
                         "eval_loss stayed at {value:.2f} of the initial loss while the training loss vanished: "
                         "held-out data is not predicted as well as training data", OFTEN)
EVAL_ROSE = measured("LOSS007", "eval_ratio", ">=", 1.0, "eval_loss ({value:.2f} of the initial loss) rose while "
                     "the training loss vanished: overfitting", "", RARELY)
# GRAD006 reads the rewards beside a zero gradient: equal in every group, or varying (a reward_std above 0).
# Only an RL run shows either, and RL_RUN already counts how rare those are: their background is that of RL
# runs, where rewards usually vary.
EQUAL_REWARDS = measured("GRAD006", "degenerate_rewards", ">=", 1, "every group's rewards are identical "
                         "(reward_std 0) at the zero-gradient step", background=RARELY)
REWARDS_VARY = measured("GRAD006", "degenerate_rewards", "<=", 0, "the rewards vary inside the groups at the "
                        "zero-gradient step, so the advantages are not all 0", background=OFTEN)
RANKS_DIFFER = fired("RANK001", "the ranks' weight fingerprints or losses differ", RARELY,
                     symptom_of=("rank-desync",))
GRAD_NORM_GROWS = Clue("grad-norm-grows", RunNumber("grad_norm_grows", "the grad_norm column"), "==", True,
                       "the grad norm rises step after step, ending several times where it began",
                       "the grad norm does not rise steadily", RARELY)
MARGINS_ZERO = Clue("margins-zero", RunNumber("margins_all_zero", "the rewards/margins column"), "==", True,
                    "rewards/margins is exactly 0 on every log: the policy and the reference never differ",
                    "rewards/margins moves off 0: the policy differs from its reference", RARELY)
LOSS_AT_LN2 = Clue("loss-at-ln2", RunNumber("loss_at_ln2", "the loss column"), "==", True,
                   "the loss is ln 2 = 0.6931 on every log: a pairwise loss at a margin of exactly 0",
                   "the loss moves off ln 2", RARELY)
# TRL's SFT logs a token accuracy of exactly 0.0 when no token of the batch is supervised; a model whose
# weights are still the pretrained ones scores above 0 on any supervised token. From the first log on, then,
# it is labels masked everywhere.
NO_TOKEN_SCORED = Clue("no-token-scored", RunNumber("no_token_scored", "the mean_token_accuracy column"), "==", True,
                       "the token accuracy is exactly 0 from the first log on: no supervised token was scored",
                       "the token accuracy is above 0 from the first log: supervised tokens are scored", RARELY)
LABEL_COLUMN = Clue("column:num_label_tokens", Column(("num_label_tokens",)), "==", True,
                    "the log counts the supervised tokens per batch")
LR_COLUMN = Clue("column:lr", Column(("lr",)), "==", True, "the log shows the learning rate")
# An RL trainer's log (GRPO, PPO, DPO): reward or KL columns. Runs in general are not RL runs.
RL_RUN = Clue("rl-run", Column(("reward", "reward_std", "frac_reward_zero_std", "kl", "reward_margin",
                                "reward_accuracy")), "==", True, "an RL trainer's log (reward / KL columns)",
              background=RARELY)
