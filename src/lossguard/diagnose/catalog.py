"""Root causes for the diagnosis: each is a known issue (lossguard.knowledge) plus what its mechanism predicts.

A `CauseRule` names the signatures the issue explains, each with a prior, and states for the clues its
mechanism says something about (diagnose/clues.py) how often a run with this cause shows them: ALWAYS (the
mechanism needs it), OFTEN, RARELY, NEVER (the mechanism excludes it). The ranking (diagnose/ranking.py)
derives from these statements alone which known facts count for a cause, which against, which decide
(allow "likely") and which rule it out: a fact counts for a cause only as far as the cause predicts it more
than its rivals for the same signature do. No other numbers enter.

Priors: how often, among public reports of a signature, the issue turned out to be behind it (the
signature-to-cause decoder of the knowledge table); they order causes when the inputs decide nothing, which
the report then says, with `asks`: which facts would decide, and how to supply them. An ask whose clue the
inputs already answer is never shown. Version clues read the issue's own windows, so lint, the ranking and
`lossguard explain` cannot disagree about a release. Everything here is checked when the module loads.
"""

from __future__ import annotations

from dataclasses import dataclass

from lossguard.diagnose import clues as C
from lossguard.diagnose.clues import (
    ALWAYS,
    GRAD_NORM_GROWS,
    LOSS_AT_LN2,
    MARGINS_ZERO,
    NEVER,
    OFTEN,
    RARELY,
    AnyWindow,
    Clue,
    Level,
    in_window,
)
from lossguard.diagnose.signatures import SIGNATURES
from lossguard.knowledge import ISSUES, KnownIssue
from lossguard.knowledge import deepspeed as ds
from lossguard.knowledge import training as tr
from lossguard.knowledge.issue import VersionWindow


@dataclass(frozen=True, slots=True)
class Ask:
    """A fact that would decide, in words with how to supply it; not asked once any of `clues` is known."""

    text: str
    clues: tuple[Clue, ...] = ()


@dataclass(frozen=True, slots=True)
class CauseRule:
    issue: KnownIssue
    priors: dict[str, float]  # signature id -> prior before the run's facts
    predicts: tuple[tuple[Clue, Level], ...] = ()  # how often a run with this cause shows each clue
    asks: tuple[Ask, ...] = ()  # what would decide, when the inputs do not

    def __post_init__(self) -> None:
        unknown = set(self.priors) - set(SIGNATURES)
        if unknown or self.issue.id not in ISSUES:
            raise ValueError(f"cause {self.issue.id}: unknown signature(s) {unknown} or issue id")
        names = [clue.name for clue, _ in self.predicts]
        if len(names) != len(set(names)):
            raise ValueError(f"cause {self.issue.id}: a clue is predicted twice")
        if not self.asks:
            raise ValueError(f"cause {self.issue.id}: say which facts would decide it (asks=...)")

    @property
    def id(self) -> str:
        return self.issue.id

    def level(self, clue: Clue) -> Level | None:
        return next((level for known, level in self.predicts if known is clue), None)


def window(name: str, issue: KnownIssue, why: str, background: Level = OFTEN) -> Clue:
    return in_window(name, issue.window("deepspeed"), why, background)


CONFIG = "pass --config ds_config.json (or a log that holds DeepSpeed's config dump)"
ASK_STAGE = Ask(f"the ZeRO stage: {CONFIG}", (C.ZERO12,))
ASK_OVERLAP = Ask(f"overlap_comm: {CONFIG}", (C.OVERLAP,))
ASK_PRECISION = Ask("the precision: pass --config ds_config.json (its fp16 / bf16 sections) or the training "
                    "arguments", (C.BF16, C.FP16))


def ask_version(clue: Clue) -> Ask:
    return Ask("the DeepSpeed version: pass --env pip-freeze.txt", (clue,))


OVERLAP_WINDOW = window("window:zero12-overlap-race", ds.OVERLAP_RACE, "the IPG double-buffer race (fixed by PR #5606)")
BUCKET_WINDOW = window("window:zero12-multi-rank-bucket", ds.MULTI_RANK_BUCKET,
                       "the multi-rank bucket path bisected in #5242")
# Three releases: few runs use them, so being in the window says much.
PINGPONG_WINDOW = window("window:zero12-pingpong-index-reset", ds.PINGPONG_RESET,
                         "the IPG buffer index reset of PR #6993", RARELY)
LIFETIME_WINDOW = window("window:zero12-buffer-lifetime", ds.BUFFER_LIFETIME, "no record_stream fix (PR #7965)")
BF16_WINDOW = window("window:bf16-no-overflow-check", ds.BF16_NO_OVERFLOW_CHECK,
                     "bf16 ZeRO skips no step by default (PR #4512; default flipped in 0.19.3)")
TORCH_25 = in_window("window:torch-2.5.0", VersionWindow("torch", "2.5.0", "2.5.1"),
                     "torch 2.5.0 defaults to cuDNN SDPA on H100", RARELY)
KERNEL_WINDOWS = in_window("window:attention-kernel-nan", AnyWindow(tr.ATTENTION_KERNEL_NAN.windows),
                           "cuDNN SDPA is on by default there")
GA_WINDOW = window("window:zero2-ga-last-microbatch", ds.ZERO2_GA_LAST_MICROBATCH,
                   "ZeRO-2 restarts its gradient accumulator on every micro-batch (#7718)", RARELY)
SHARED_LOSS_WINDOW = window("window:zero2-shared-loss-ga-scaling", ds.ZERO2_SHARED_LOSS_GA,
                            "the backward API of PR #7665 mis-scales a shared loss under accumulation (#8224)", RARELY)
NORMAL_THEN_ZERO = C.fired("LOSS002", "the loss was normal before it fell to 0.0", C.OFTEN,
                           symptom_of=("nonfinite-hidden",))

# The ZeRO-1/2 reduction races: they need ZeRO-1/2 and more than one rank, a DeepSpeed run shows them, and
# they corrupt the averaged gradient (the forward pass is fine). Several nodes and fp32 communication widen
# the race window, but public reports come as often from one 8-GPU node with bf16 communication: they are
# stated for no race (they would count a single node against it).
RACE = ((C.ZERO12, ALWAYS), (C.MULTI_RANK, ALWAYS), (C.DEEPSPEED_SHOWN, OFTEN), (C.GRAD_FIRST, OFTEN),
        (C.ON_EVAL, NEVER), (C.FSDP_SHOWN, NEVER))
RACE_ASKS = (ASK_STAGE, ASK_OVERLAP)

# A gradient that never reaches the weights does not stop the optimizer from stepping: the scheduler moves
# the LR off 0. An LR stuck at 0 beside a 0.0 norm is a step never taken, which they never explain.
CAUSES: tuple[CauseRule, ...] = (
    # Loss normal, then 0.0 with grad_norm nan / a sentinel: the decoder's most frequent cause in public
    # DeepSpeed fine-tuning reports (the ZeRO-1/2 race family), hence the highest of the race priors.
    CauseRule(ds.OVERLAP_RACE, {"nonfinite-hidden": 0.45, "nonfinite": 0.35, "zero-loss": 0.15},
              predicts=(*RACE, (C.OVERLAP, ALWAYS), (OVERLAP_WINDOW, ALWAYS)),
              asks=(*RACE_ASKS, ask_version(OVERLAP_WINDOW))),
    CauseRule(ds.MULTI_RANK_BUCKET, {"nonfinite-hidden": 0.2, "nonfinite": 0.15},
              predicts=(*RACE, (C.OVERLAP, ALWAYS), (BUCKET_WINDOW, ALWAYS), (C.MULTI_RANK_BUCKET, ALWAYS)),
              asks=(*RACE_ASKS, ask_version(BUCKET_WINDOW))),
    # Three releases only: rare in the field unless the version says so.
    CauseRule(ds.PINGPONG_RESET, {"nonfinite-hidden": 0.05, "nonfinite": 0.05},
              predicts=(*RACE, (C.OVERLAP, ALWAYS), (PINGPONG_WINDOW, ALWAYS)),
              asks=(*RACE_ASKS, ask_version(PINGPONG_WINDOW))),
    CauseRule(ds.BUFFER_LIFETIME, {"nonfinite-hidden": 0.1, "nonfinite": 0.1},
              predicts=(*RACE, (C.OVERLAP, ALWAYS), (LIFETIME_WINDOW, ALWAYS)),
              asks=(*RACE_ASKS, ask_version(LIFETIME_WINDOW))),
    # The amplifier: whatever made the first NaN, bf16 ZeRO applied it. Behind many dead bf16 runs.
    CauseRule(ds.BF16_NO_OVERFLOW_CHECK, {"nonfinite-hidden": 0.35, "nonfinite": 0.3},
              predicts=((C.BF16, ALWAYS), (C.FP16, NEVER), (C.CHECK_OFF, ALWAYS), (BF16_WINDOW, ALWAYS),
                        (C.DEEPSPEED_SHOWN, OFTEN), (C.GRAD_FIRST, OFTEN), (C.ON_EVAL, NEVER), (C.FSDP_SHOWN, NEVER)),
              asks=(ASK_PRECISION, Ask("bf16.check_grad_overflow: pass --config ds_config.json", (C.CHECK_OFF,)),
                    ask_version(BF16_WINDOW))),
    # Every step overflows: the decoder's cause for an overflow storm, and for an LR frozen at its warmup
    # start or a grad_norm of 0.0 from the first step (DeepSpeed logs 0.0 until a step succeeds).
    CauseRule(tr.FP16_ACTIVATION_OVERFLOW, {"fp16-overflow": 0.8, "nonfinite-hidden": 0.05, "lr-zero": 0.3,
                                            "no-grad-flow": 0.1},
              predicts=((C.FP16, ALWAYS), (C.BF16, NEVER), (C.OVERFLOW_LINES, OFTEN), (C.SCALE_FLOOR, OFTEN),
                        (C.LR_BEFORE_STEP, OFTEN), (C.NORM_ZERO_LR_ZERO, OFTEN), (C.LR_FROZEN, OFTEN)),
              asks=(ASK_PRECISION, Ask("whether the model was pre-trained in bf16 (Qwen, GLM-4, Gemma: their "
                                       "activations exceed fp16's range): the model card"))),
    CauseRule(tr.ATTENTION_KERNEL_NAN, {"nonfinite-hidden": 0.1, "nonfinite": 0.12},
              predicts=((KERNEL_WINDOWS, ALWAYS), (TORCH_25, OFTEN), (C.CPU_TORCH, NEVER), (C.CUDNN_SDPA, OFTEN),
                        (C.ONSET_AT_START, OFTEN), (C.GRAD_FIRST, OFTEN), (C.ON_EVAL, NEVER)),
              asks=(Ask("the torch version: pass --env pip-freeze.txt", (KERNEL_WINDOWS,)),
                    Ask("the attention backend: rerun a few steps with "
                        "torch.backends.cuda.enable_cudnn_sdp(False)", (C.CUDNN_SDPA,)))),
    CauseRule(tr.LR_TOO_HIGH, {"divergence": 0.7, "loss-spike": 0.6, "nonfinite": 0.15, "nonfinite-hidden": 0.1},
              predicts=((C.SPIKE_BEFORE, OFTEN), (C.DIVERGED_BEFORE, OFTEN), (C.LOSS_EXPLODED, OFTEN),
                        (C.STEADY_BEFORE, RARELY), (C.GRAD_FIRST, RARELY), (C.ON_EVAL, NEVER)),
              asks=(Ask("the loss before the failure: the log from the first step (a spike or a rise before the "
                        "NaN points to the learning rate)", (C.STEADY_BEFORE, C.SPIKE_BEFORE)),
                    Ask("the run at half the learning rate: lossguard probe with the same seed"))),
    CauseRule(tr.MASKED_BATCH_NAN, {"nonfinite-hidden": 0.1, "nonfinite": 0.1},
              predicts=((C.TOKENIZATION_MISMATCH, OFTEN), (C.RESPONSE_KEY_MISSING, OFTEN),
                        (C.MASKED_BATCHES, OFTEN), (C.ONSET_AT_START, OFTEN), (C.GRAD_FIRST, RARELY),
                        (C.ON_EVAL, NEVER), (C.NO_TOKEN_SCORED, OFTEN)),
              asks=(Ask("the supervised-token count per batch: log (labels != -100).sum() per micro-batch (the "
                        "live guard does)", (C.LABEL_COLUMN, C.MASKED_BATCHES)),)),
    # TRL's "Could not find response key" is printed both when the response template tokenizes differently in
    # context (a template mismatch) and when truncation cut the response off: it tells the two apart no more
    # than its advice to raise max_seq_length does.
    CauseRule(tr.TEMPLATE_MISMATCH, {"masked-labels": 0.55, "zero-loss": 0.35},
              predicts=((C.TOKENIZATION_MISMATCH, OFTEN), (C.RESPONSE_KEY_MISSING, OFTEN), (NORMAL_THEN_ZERO, RARELY),
                        (C.ONSET_AT_START, OFTEN), (C.NO_TOKEN_SCORED, OFTEN)),
              asks=(Ask("which tokens are supervised: decode one batch where labels != -100 and check it is the "
                        "assistant turn (a 'tokenization mismatch' warning in the log would decide)",
                        (C.TOKENIZATION_MISMATCH,)),)),
    CauseRule(tr.TRUNCATION_CUTS_ANSWERS, {"masked-labels": 0.35, "zero-loss": 0.25},
              predicts=((C.RESPONSE_KEY_MISSING, OFTEN), (NORMAL_THEN_ZERO, RARELY), (C.ONSET_AT_START, OFTEN),
                        (C.NO_TOKEN_SCORED, OFTEN)),
              asks=(Ask("the tokenized lengths against max_length / cutoff_len (a histogram of one epoch)"),)),
    CauseRule(tr.IMAGE_TOKEN_MISMATCH, {"masked-labels": 0.05, "zero-loss": 0.05},
              predicts=((C.IMAGE_TOKEN_MISMATCH, OFTEN),),
              asks=(Ask("the image-token count per sample against the vision embeddings",
                        (C.IMAGE_TOKEN_MISMATCH,)),)),
    CauseRule(tr.LORA_REENTRANT, {"no-grad-flow": 0.55, "not-learning": 0.3},
              predicts=((C.NO_INPUT_GRAD, OFTEN), (C.REENTRANT, OFTEN), (C.CHECKPOINTING, ALWAYS),
                        (C.NORM_ZERO_LR_ZERO, NEVER)),
              asks=(Ask("whether gradient checkpointing is on with LoRA: the training arguments, or the log's "
                        "'None of the inputs have requires_grad=True' warning", (C.CHECKPOINTING, C.NO_INPUT_GRAD)),)),
    CauseRule(tr.TRAINABLE_NOT_OPTIMIZED, {"no-grad-flow": 0.45, "not-learning": 0.35},
              predicts=((C.NOT_IN_OPTIMIZER, OFTEN), (C.NO_TRAINABLE, OFTEN), (C.NORM_ZERO_LR_ZERO, NEVER)),
              asks=(Ask("the trainable parameters against the optimizer's: the Trainer's 'Number of trainable "
                        "parameters' line, or the live guard (it compares them)", (C.NOT_IN_OPTIMIZER,)),)),
    # LR 0 on every log: the scheduler has not moved (a warmup longer than the run, a scheduler stepped per
    # epoch). Nothing in a log shows the scheduler's settings. The Trainer's "tried to get lr value before
    # scheduler/optimizer started stepping" comes only from a DeepSpeed scheduler that has never stepped,
    # i.e. every step so far was skipped: a scheduler that steps slowly or late does not print it.
    CauseRule(tr.SCHEDULER_NOT_STEPPING, {"lr-zero": 0.6},
              predicts=((C.LR_BEFORE_STEP, RARELY), (C.OVERFLOW_LINES, RARELY), (C.NORM_ZERO_LR_ZERO, RARELY)),
              asks=(Ask("the scheduler settings (warmup_steps / warmup_ratio against max_steps) in the training "
                        "arguments"),)),
    CauseRule(tr.LR_TOO_SMALL, {"not-learning": 0.4, "lr-zero": 0.2},
              predicts=((C.LR_BEFORE_STEP, RARELY), (C.NORM_ZERO_LR_ZERO, RARELY)),
              asks=(Ask("the learning-rate schedule: the logged learning rate over the whole run", (C.LR_COLUMN,)),)),
    CauseRule(tr.WEIGHTS_NOT_UPDATING, {"not-learning": 0.35, "zero-loss": 0.05},
              predicts=((C.LR_IS_ZERO, OFTEN),),
              asks=(Ask("whether the weights change: the learning rate in the log, or the live guard's update "
                        "ratio", (C.LR_COLUMN,)),)),
    CauseRule(tr.LABEL_LEAKAGE, {"memorization": 0.25},
              predicts=((C.EVAL_VANISHED, ALWAYS), (C.EVAL_ROSE, NEVER)),
              asks=(Ask("the evaluation loss: log eval_loss (eval_strategy steps)", (C.EVAL_VANISHED, C.EVAL_ROSE)),)),
    CauseRule(tr.BENIGN_MEMORIZATION, {"memorization": 0.75},
              predicts=((C.EVAL_ROSE, OFTEN), (C.EVAL_VANISHED, RARELY)),
              asks=(Ask("the evaluation loss: log eval_loss (eval_strategy steps)", (C.EVAL_VANISHED, C.EVAL_ROSE)),)),
    CauseRule(tr.REPLICA_DIVERGENCE, {"rank-desync": 1.0},
              predicts=((C.RANKS_DIFFER, ALWAYS),),
              asks=(Ask("per-rank weight checksums at the onset step (the live guard compares them)"),)),
    CauseRule(tr.NUMERICAL_INSTABILITY, {"nonfinite": 0.3, "nonfinite-hidden": 0.2, "divergence": 0.3,
                                          "zero-loss": 0.1, "fp16-overflow": 0.2},
              predicts=((C.FP16, OFTEN), (C.OVERFLOW_LINES, OFTEN), (C.SPIKE_BEFORE, OFTEN),
                        (C.DIVERGED_BEFORE, OFTEN), (C.LOSS_EXPLODED, OFTEN), (C.ON_EVAL, NEVER),
                        (C.LR_FROZEN, OFTEN), (C.GRAD_FIRST, RARELY)),
              asks=(ASK_PRECISION, Ask("the loss before the NaN (a spike or rise before it points to the learning "
                                       "rate)", (C.STEADY_BEFORE, C.SPIKE_BEFORE)))),
    # An evaluation loss averages over supervised tokens: one eval batch (or shard) with none is 0/0. Rare
    # behind a NaN in general (a small prior); the log's own fact, NaN in evaluation only, decides it.
    CauseRule(tr.EVAL_ONLY_NAN, {"nonfinite": 0.02},
              predicts=((C.ON_EVAL, ALWAYS),),
              asks=(Ask("the supervised-token count per evaluation batch"),)),
    # Both RL causes apply only to RL trainers' logs (reward columns): small priors, decided by GRAD006's
    # reading of the rewards beside the zero gradient.
    CauseRule(tr.RL_DEGENERATE_REWARDS, {"no-grad-flow": 0.02, "not-learning": 0.02},
              predicts=((C.RL_RUN, ALWAYS), (C.EQUAL_REWARDS, ALWAYS), (C.REWARDS_VARY, NEVER)),
              asks=(Ask("the reward standard deviation per group (reward_std, frac_reward_zero_std)",
                        (C.EQUAL_REWARDS, C.REWARDS_VARY)),)),
    # A hand-written loop that never zeroes the gradients: each step applies the sum of all gradients so far,
    # so the loss falls, then climbs back steadily while the norm grows with the step count.
    CauseRule(tr.ZERO_GRAD_MISSING, {"divergence": 0.15},
              predicts=((GRAD_NORM_GROWS, ALWAYS), (C.SPIKE_BEFORE, RARELY), (C.LOSS_EXPLODED, RARELY)),
              asks=(Ask("the grad norm over the run: log it (a norm that grows with the step count is a gradient "
                        "never zeroed)", (GRAD_NORM_GROWS,)),)),
    # The framework's loop (Megatron-style) checks overflow only through the fp16 scaler: under bf16 a NaN
    # step is applied and its loss field simply vanishes from the log line.
    CauseRule(tr.FRAMEWORK_BF16_NO_NAN_CHECK, {"nonfinite": 0.1, "nonfinite-hidden": 0.05},
              predicts=((C.BF16, ALWAYS), (C.FP16, NEVER), (C.OVERFLOW_LINES, NEVER), (C.ON_EVAL, NEVER),
                        (C.LOSS_VANISHED, OFTEN)),
              asks=(ASK_PRECISION, Ask("whether the training loop checks for NaN: its arguments (Megatron-LM: "
                                       "--check-for-nan-in-loss-and-grad)", (C.LOSS_VANISHED,)))),
    # DPO at a margin of 0 on every log: the policy never differs from its reference.
    CauseRule(tr.DPO_POLICY_IS_REFERENCE, {"not-learning": 0.1},
              predicts=((MARGINS_ZERO, ALWAYS), (LOSS_AT_LN2, ALWAYS)),
              asks=(Ask("the DPO reward margins (rewards/margins) on every log", (MARGINS_ZERO,)),)),
    # ZeRO-2 gradient-correctness regressions: no dead run, a quality loss (a slower or wrong descent). They
    # need ZeRO stage 2, gradient accumulation and a DeepSpeed release in their (narrow) window.
    CauseRule(ds.ZERO2_GA_LAST_MICROBATCH, {"not-learning": 0.02, "divergence": 0.02},
              predicts=((C.ZERO2, ALWAYS), (C.GA, ALWAYS), (GA_WINDOW, ALWAYS), (C.DEEPSPEED_SHOWN, OFTEN),
                        (C.FSDP_SHOWN, NEVER)),
              asks=(ASK_STAGE, ask_version(GA_WINDOW))),
    CauseRule(ds.ZERO2_SHARED_LOSS_GA, {"not-learning": 0.02, "divergence": 0.02},
              predicts=((C.ZERO2, ALWAYS), (C.GA, ALWAYS), (C.MULTI_RANK, ALWAYS), (C.BF16, ALWAYS),
                        (SHARED_LOSS_WINDOW, ALWAYS), (C.DEEPSPEED_SHOWN, OFTEN), (C.FSDP_SHOWN, NEVER)),
              asks=(ASK_STAGE, ask_version(SHARED_LOSS_WINDOW))),
    CauseRule(tr.RL_UPDATE_LOST, {"no-grad-flow": 0.02},
              predicts=((C.RL_RUN, ALWAYS), (C.REWARDS_VARY, OFTEN), (C.EQUAL_REWARDS, NEVER)),
              asks=(Ask("the reward standard deviation per group (reward_std, frac_reward_zero_std)",
                        (C.EQUAL_REWARDS, C.REWARDS_VARY)),)),
)

if len({c.id for c in CAUSES}) != len(CAUSES):
    raise ValueError("a known issue is ranked twice in the cause catalog")
