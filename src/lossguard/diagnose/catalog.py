"""Root causes for the diagnosis: each is a known issue (lossguard.knowledge) plus how to rank it.

A `CauseRule` names the signatures the issue explains with a prior, and typed conditions that raise the score
(evidence for) or lower it (evidence against); the ranking multiplies. Version conditions read the issue's own
windows, so lint, the ranking and `lossguard explain` cannot disagree about a release. Everything here is
checked when the module loads: unknown facts, signatures or issue ids raise.
"""

from __future__ import annotations

from dataclasses import dataclass

from lossguard.diagnose.signatures import SIGNATURES
from lossguard.knowledge import ISSUES, KnownIssue
from lossguard.knowledge import deepspeed as ds
from lossguard.knowledge import training as tr
from lossguard.knowledge.conditions import (
    Condition,
    Event,
    Fact,
    Fired,
    Measured,
    NoneKnown,
    OnsetAtStart,
    inside,
    outside,
)
from lossguard.knowledge.issue import VersionWindow


@dataclass(frozen=True, slots=True)
class CauseRule:
    issue: KnownIssue
    priors: dict[str, float]  # signature id -> prior before the run's facts
    conditions: tuple[Condition, ...] = ()

    def __post_init__(self) -> None:
        unknown = set(self.priors) - set(SIGNATURES)
        if unknown or self.issue.id not in ISSUES:
            raise ValueError(f"cause {self.issue.id}: unknown signature(s) {unknown} or issue id")

    @property
    def id(self) -> str:
        return self.issue.id


def fact(name: str, op: str, value, factor: float, reason: str = "") -> Condition:
    return Condition(Fact(name), op, value, factor, reason)


def event(name: str, factor: float, reason: str = "") -> Condition:
    return Condition(Event(name), ">=", 1, factor, reason)


def fired(code: str, factor: float, reason: str) -> Condition:
    return Condition(Fired(code), "==", True, factor, reason)


def onset_at_start(factor: float, reason: str) -> Condition:
    return Condition(OnsetAtStart(), "==", True, factor, reason)


def window_conditions(issue: KnownIssue, factor: float, why: str, against: float = 0.05) -> tuple[Condition, ...]:
    """For and against from the issue's own DeepSpeed window: inside raises, outside lowers."""
    window = issue.window("deepspeed")
    return (inside(window, factor, f"DeepSpeed {{value}} is in the affected range ({window}): {why}"),
            outside(window, against, f"DeepSpeed {{value}} is outside the affected range ({window})"))


ZERO12 = fact("zero_stage", "in", [1, 2], 2.0, "ZeRO stage {value} (the races are in ZeRO-1/2)")
NOT_ZERO12 = fact("zero_stage", "in", [0, 3], 0.1, "ZeRO stage {value} has no ZeRO-1/2 reduction race")
OVERLAP_ON = fact("overlap_comm", "==", True, 2.5, "overlap_comm is true")
OVERLAP_OFF = fact("overlap_comm", "==", False, 0.05, "overlap_comm is false: the reduction is serialised")
SINGLE_RANK = fact("world_size", "==", 1, 0.05, "a single rank cannot race on reduction")
# A log with no DeepSpeed config dump and no --config / --env says nothing for a ZeRO-1/2 race: such a cause
# keeps a small share (it may still be the one), but the causes the log itself shows come first.
NO_DEEPSPEED_FACTS = Condition(NoneKnown(("deepspeed_version", "zero_stage", "overlap_comm")), "==", True, 0.1,
                               "nothing in the log shows DeepSpeed ZeRO-1/2 (no version, stage or overlap_comm; "
                               "pass --config / --env to judge it)")
ZERO12_RACE = (ZERO12, NOT_ZERO12, SINGLE_RANK, NO_DEEPSPEED_FACTS)
CUDA_ONLY = fact("torch_version", "endswith", "+cpu", 0.05, "torch {value} is a CPU build: no cuDNN kernels")

CAUSES: tuple[CauseRule, ...] = (
    CauseRule(ds.OVERLAP_RACE, {"nonfinite-hidden": 0.45, "nonfinite": 0.35, "zero-loss": 0.15}, (
        *ZERO12_RACE, OVERLAP_ON, OVERLAP_OFF,
        *window_conditions(ds.OVERLAP_RACE, 3.0, "the IPG double-buffer race (fixed by PR #5606)", against=0.3),
        fact("communication_data_type", "==", "fp32", 1.5, "communication_data_type fp32 widens the race window"),
        fact("num_nodes", ">=", 2, 1.5, "{value} nodes: slower communication widens the race window"),
    )),
    CauseRule(ds.MULTI_RANK_BUCKET, {"nonfinite-hidden": 0.2, "nonfinite": 0.15}, (
        *ZERO12_RACE, OVERLAP_OFF,
        *window_conditions(ds.MULTI_RANK_BUCKET, 4.0, "the multi-rank bucket path bisected in #5242", against=0.1),
        fact("use_multi_rank_bucket_allreduce", "==", False, 0.1, "use_multi_rank_bucket_allreduce is false"),
        fact("use_multi_rank_bucket_allreduce", "==", True, 1.5, "use_multi_rank_bucket_allreduce is true"),
    )),
    CauseRule(ds.PINGPONG_RESET, {"nonfinite-hidden": 0.05, "nonfinite": 0.05}, (
        *ZERO12_RACE, OVERLAP_OFF,
        *window_conditions(ds.PINGPONG_RESET, 30.0, "the IPG buffer index reset of PR #6993", against=0.01),
    )),
    CauseRule(ds.BUFFER_LIFETIME, {"nonfinite-hidden": 0.1, "nonfinite": 0.1}, (
        *ZERO12_RACE, OVERLAP_ON, OVERLAP_OFF,
        *window_conditions(ds.BUFFER_LIFETIME, 2.5, "no record_stream fix (PR #7965)"),
        fact("num_nodes", ">=", 2, 2.0, "{value} nodes"),
    )),
    CauseRule(ds.BF16_NO_OVERFLOW_CHECK, {"nonfinite-hidden": 0.35, "nonfinite": 0.3}, (
        Condition(NoneKnown(("deepspeed_version", "zero_stage", "bf16")), "==", True, 0.1,
                  "nothing in the log shows a DeepSpeed bf16 ZeRO run (pass --config / --env to judge it)"),
        fact("bf16", "==", True, 2.0, "bf16 is on"),
        fact("fp16", "==", True, 0.05, "fp16 runs skip overflowing steps"),
        fact("check_grad_overflow", "==", False, 3.0, "bf16.check_grad_overflow is false"),
        fact("check_grad_overflow", "==", True, 0.15, "bf16.check_grad_overflow is true"),
        inside(ds.BF16_NO_OVERFLOW_CHECK.window("deepspeed"), 1.5,
               "DeepSpeed {value}: bf16 ZeRO skips no step by default (PR #4512; default flipped in 0.19.3)"),
        fact("zero_stage", "==", 3, 1.5, "ZeRO-3 has no bf16 overflow check at all"),
    )),
    CauseRule(tr.FP16_ACTIVATION_OVERFLOW, {"fp16-overflow": 0.8, "nonfinite-hidden": 0.05, "lr-zero": 0.3}, (
        fact("fp16", "==", True, 2.0, "fp16 is on"),
        fact("bf16", "==", True, 0.1, "the run is bf16"),
        event("overflow", 2.0, "{value} DeepSpeed OVERFLOW lines"),
        event("scale-at-minimum", 2.0, "the loss scale hit its minimum"),
        fired("LR002", 4.0, "loss and learning rate both exactly 0: no step was ever applied and the loss is a "
                            "filtered NaN, what an overflow on every fp16 step looks like"),
    )),
    CauseRule(tr.ATTENTION_KERNEL_NAN, {"nonfinite-hidden": 0.1, "nonfinite": 0.12}, (
        inside(VersionWindow("torch", "2.5.0", "2.5.1"), 5.0, "torch {value} defaults to cuDNN SDPA on H100"),
        inside(VersionWindow("torch", "2.9.0"), 1.3, "torch {value} re-enabled cuDNN SDPA on SM90/100"),
        CUDA_ONLY,
        Condition(NoneKnown(("torch_version",)), "==", True, 0.3,
                  "the torch version is unknown (the kernel bugs are in torch 2.5.0 and >= 2.9 on H100/H200)"),
        event("cudnn-sdpa", 6.0, "cuDNN SDPA backward warning in the log"),
        onset_at_start(2.0, "NaN from the first logged step"),
    )),
    CauseRule(tr.LR_TOO_HIGH, {"divergence": 0.7, "loss-spike": 0.6, "nonfinite": 0.15, "nonfinite-hidden": 0.1}, (
        fired("LOSS006", 2.0, "a loss spike came before"),
        fired("LOSS005", 2.0, "the loss diverged"),
        onset_at_start(0.5, "trouble from the very first step, before any large update"),
    )),
    CauseRule(tr.MASKED_BATCH_NAN, {"nonfinite-hidden": 0.1, "nonfinite": 0.1}, (
        event("tokenization-mismatch", 4.0, "{value} tokenization-mismatch warnings"),
        event("response-key-missing", 4.0, "{value} 'Could not find response key' warnings"),
        onset_at_start(1.5, "NaN from the first logged step"),
    )),
    CauseRule(tr.TEMPLATE_MISMATCH, {"masked-labels": 0.55, "zero-loss": 0.35}, (
        fired("LOSS002", 0.3, "the loss was normal before it fell to 0.0: masking in preprocessing shows from "
                              "the first step"),
        onset_at_start(4.0, "the loss is 0.0 from the first steps on, as when every sample's labels are masked"),
        event("tokenization-mismatch", 5.0, "{value} 'tokenization mismatch' warnings"),
    )),
    CauseRule(tr.TRUNCATION_CUTS_ANSWERS, {"masked-labels": 0.35, "zero-loss": 0.25}, (
        fired("LOSS002", 0.3, "the loss was normal before it fell to 0.0: masking in preprocessing shows from "
                              "the first step"),
        event("response-key-missing", 5.0, "{value} 'Could not find response key' warnings"),
    )),
    CauseRule(tr.IMAGE_TOKEN_MISMATCH, {"masked-labels": 0.05, "zero-loss": 0.05}, (
        event("image-token-mismatch", 40.0, "{value} image-token mismatch warnings"),
    )),
    CauseRule(tr.LORA_REENTRANT, {"no-grad-flow": 0.55, "not-learning": 0.3}, (
        event("no-input-grad", 3.0, "PyTorch warned 'None of the inputs have requires_grad=True'"),
        event("reentrant-checkpoint", 1.5, "reentrant checkpointing warning"),
        fact("gradient_checkpointing", "==", True, 2.0, "gradient checkpointing on"),
        fact("gradient_checkpointing", "==", False, 0.1, "gradient checkpointing is off"),
    )),
    CauseRule(tr.TRAINABLE_NOT_OPTIMIZED, {"no-grad-flow": 0.45, "not-learning": 0.35}, (
        event("trainable-not-in-optimizer", 10.0, "parameters outside the optimizer"),
    )),
    CauseRule(tr.SCHEDULER_NOT_STEPPING, {"lr-zero": 0.6}, (
        event("lr-before-step", 2.0, "the Trainer warned the scheduler has not stepped"),
        fired("LR002", 0.5, "the loss is 0.0 too: a warmup that has not started leaves a real loss"),
        event("overflow", 0.3),
    )),
    CauseRule(tr.LR_TOO_SMALL, {"not-learning": 0.4, "lr-zero": 0.2}, (event("lr-before-step", 0.5),)),
    CauseRule(tr.WEIGHTS_NOT_UPDATING, {"not-learning": 0.35, "zero-loss": 0.05}, (
        fired("LR001", 3.0, "the learning rate is 0"),
    )),
    CauseRule(tr.LABEL_LEAKAGE, {"memorization": 0.25}, (
        inside(tr.LABEL_LEAKAGE.window("transformers"), 4.0, "transformers {value}: Gemma-2 4-D mask bug (#31673)"),
        Condition(Measured("LOSS007", "eval_ratio"), "<=", 0.5, 12.0,
                  "eval_loss fell too ({value:.2f} of the initial loss): held-out data is predicted as well as "
                  "training data, so the answers are visible"),
        Condition(Measured("LOSS007", "eval_ratio"), ">=", 1.0, 0.2,
                  "eval_loss rose ({value:.2f} of the initial loss): the answers are not visible"),
    )),
    CauseRule(tr.BENIGN_MEMORIZATION, {"memorization": 0.75}, (
        Condition(Measured("LOSS007", "eval_ratio"), ">=", 1.0, 3.0,
                  "eval_loss ({value:.2f} of the initial loss) rose while the training loss vanished: "
                  "overfitting a small dataset"),
    )),
    CauseRule(tr.REPLICA_DIVERGENCE, {"rank-desync": 1.0}),
    CauseRule(tr.NUMERICAL_INSTABILITY, {"nonfinite": 0.3, "nonfinite-hidden": 0.2, "divergence": 0.3,
                                          "zero-loss": 0.1}, (
        fact("fp16", "==", True, 2.0, "fp16 is on: activations above 65504 overflow"),
        fired("LOSS002", 4.0, "the loss fell from a normal value to exactly 0.0 in one log: the Trainer's NaN "
                              "filter prints a NaN loss as 0.0"),
        Condition(Measured("LOSS002", "lr_frozen"), ">=", 1, 2.0,
                  "the learning rate did not move at that log: the optimizer skipped the step"),
        onset_at_start(0.6, "trouble from the first steps, before any large update"),
        event("overflow", 1.5, "{value} loss-scale OVERFLOW lines"),
        fired("LOSS005", 1.5, "the loss diverged first"),
        Condition(Measured("LOSS001", "on_eval"), ">=", 1, 0.2, "only the evaluation loss is non-finite"),
    )),
    CauseRule(tr.EVAL_ONLY_NAN, {"nonfinite": 0.02}, (
        Condition(Measured("LOSS001", "on_eval"), ">=", 1, 50.0,
                  "the evaluation loss is non-finite while training logs stay finite"),
    )),
    CauseRule(tr.RL_DEGENERATE_REWARDS, {"no-grad-flow": 0.02, "not-learning": 0.02}, (
        Condition(Measured("GRAD006", "degenerate_rewards"), ">=", 1, 100.0,
                  "an RL step with zero gradient whose groups all have identical rewards (reward_std 0)"),
        Condition(Measured("GRAD006", "degenerate_rewards"), "<=", 0, 0.5,
                  "the rewards vary inside the groups, so the advantages are not all 0"),
    )),
    CauseRule(tr.RL_UPDATE_LOST, {"no-grad-flow": 0.02}, (
        Condition(Measured("GRAD006", "degenerate_rewards"), "<=", 0, 100.0,
                  "an RL step with zero gradient although the rewards vary (reward_std > 0)"),
        Condition(Measured("GRAD006", "degenerate_rewards"), ">=", 1, 0.1,
                  "every group's rewards are identical: a zero gradient is expected"),
    )),
)

if len({c.id for c in CAUSES}) != len(CAUSES):
    raise ValueError("a known issue is ranked twice in the cause catalog")
