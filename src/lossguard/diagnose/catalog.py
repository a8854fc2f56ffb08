"""Root causes for the diagnosis: each is a known issue (lossguard.knowledge) plus how to rank it.

A `CauseRule` names the signatures the issue explains with a prior, and typed conditions; the ranking
multiplies the prior by the factor of every condition that holds on this run's inputs. Three kinds:

- `shown_by`: facts that show the cause's mechanism applies to this run (fp16 on, for an fp16 overflow; the
  ZeRO stage, for a ZeRO-1/2 race; a tokenization warning, for a template mismatch). A cause can be called
  `likely` only when one of them holds: a prior and a matching symptom are never enough.
- `ruled_out_by`: facts that contradict the mechanism (bf16, for an fp16 overflow; ZeRO-3, for a ZeRO-1/2
  race). One that holds makes the cause `unlikely`, whatever its score.
- `conditions`: how well the run's symptoms fit the mechanism (which went non-finite first, a spike before,
  an onset at the first step). They order the candidates but decide nothing.

Priors: how often, among public reports of a signature, the issue turned out to be behind it (the
signature-to-cause decoder of the knowledge table); they order causes when the inputs decide nothing, which
the report then says, with `decide`: which fact would, and how to supply it. Unknown facts change nothing.
Version conditions read the issue's own windows, so lint, the ranking and `lossguard explain` cannot disagree
about a release. Everything here is checked when the module loads: unknown facts, signatures or issue ids raise.
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
    SteadyBeforeOnset,
    inside,
    outside,
)
from lossguard.knowledge.issue import VersionWindow


@dataclass(frozen=True, slots=True)
class CauseRule:
    issue: KnownIssue
    priors: dict[str, float]  # signature id -> prior before the run's facts
    conditions: tuple[Condition, ...] = ()  # symptom fit: orders the candidates, decides nothing
    shown_by: tuple[Condition, ...] = ()  # facts showing the mechanism applies: one is needed for "likely"
    ruled_out_by: tuple[Condition, ...] = ()  # facts contradicting the mechanism: "unlikely"
    decide: str = ""  # which facts would decide, and how to supply them, when none is known

    def __post_init__(self) -> None:
        unknown = set(self.priors) - set(SIGNATURES)
        if unknown or self.issue.id not in ISSUES:
            raise ValueError(f"cause {self.issue.id}: unknown signature(s) {unknown} or issue id")
        if any(not c.supports for c in self.shown_by) or any(c.supports for c in self.ruled_out_by):
            raise ValueError(f"cause {self.issue.id}: shown_by factors must be > 1, ruled_out_by factors < 1")
        if self.shown_by and not self.decide:
            raise ValueError(f"cause {self.issue.id}: say how to supply the deciding facts (decide=...)")

    @property
    def id(self) -> str:
        return self.issue.id

    @property
    def all_conditions(self) -> tuple[Condition, ...]:
        return self.shown_by + self.ruled_out_by + self.conditions


def fact(name: str, op: str, value, factor: float, reason: str = "") -> Condition:
    return Condition(Fact(name), op, value, factor, reason)


def event(name: str, factor: float, reason: str = "") -> Condition:
    return Condition(Event(name), ">=", 1, factor, reason)


def fired(code: str, factor: float, reason: str) -> Condition:
    return Condition(Fired(code), "==", True, factor, reason)


def measured(code: str, key: str, op: str, value: float, factor: float, reason: str) -> Condition:
    return Condition(Measured(code, key), op, value, factor, reason)


def onset_at_start(factor: float, reason: str) -> Condition:
    return Condition(OnsetAtStart(), "==", True, factor, reason)


def steady_before(factor: float, mechanism: str) -> Condition:
    """At least three finite losses logged before the onset, none of them a spike or part of a rise."""
    return Condition(SteadyBeforeOnset(), ">=", 3, factor, "the loss was steady for {value} logs before the failure, "
                     f"with no spike or rise: {mechanism}")


def unknown(names: tuple[str, ...], factor: float, reason: str) -> Condition:
    """None of `names` is known: the inputs do not show what the mechanism needs. Not evidence against (it is
    never listed as such): it only lets the causes the inputs do show come first."""
    return Condition(NoneKnown(names), "==", True, factor, reason)


def window_in(issue: KnownIssue, factor: float, why: str) -> Condition:
    window = issue.window("deepspeed")
    return inside(window, factor, f"DeepSpeed {{value}} is in the affected range ({window}): {why}")


def window_out(issue: KnownIssue, factor: float) -> Condition:
    window = issue.window("deepspeed")
    return outside(window, factor, f"DeepSpeed {{value}} is outside the affected range ({window})")


# Which went non-finite first (LOSS001 `loss_finite`): the gradient beside a finite loss puts the fault after
# the forward pass (backward, the gradient reduction); the loss itself puts it in the forward pass.
GRAD_FIRST = "the gradient went non-finite while the loss beside it was finite: the forward pass was fine"
LOSS_FIRST = "the loss itself went non-finite, with no non-finite gradient logged before it"


def grad_first(factor: float, mechanism: str) -> Condition:
    return measured("LOSS001", "loss_finite", ">=", 1, factor, f"{GRAD_FIRST}; {mechanism}")


def loss_first(factor: float, mechanism: str) -> Condition:
    return measured("LOSS001", "loss_finite", "<=", 0, factor, f"{LOSS_FIRST}; {mechanism}")


LOSS_EXPLODED = measured("LOSS001", "loss_exploded", ">=", 1, 2.0, "the loss jumped more than tenfold beside the "
                         "first non-finite gradient norm: the update before it blew the weights up")
# DeepSpeed ZeRO-1/2 replaces a non-finite param group's norm by -1 and logs sqrt(groups): a pinned sentinel
# shows the run is a DeepSpeed ZeRO run whose gradients went non-finite.
SENTINEL = (measured("GRAD001", "groups", ">=", 1, 1.5, "grad_norm is pinned at DeepSpeed ZeRO's sqrt(k) "
                     "sentinel for non-finite gradients: a DeepSpeed ZeRO-1/2 run"),
            measured("LOSS002", "sentinel_groups", ">=", 1, 1.5, "the grad_norm beside the 0.0 loss is DeepSpeed "
                     "ZeRO's sqrt(k) sentinel for non-finite gradients: a DeepSpeed ZeRO-1/2 run"))
ZERO12 = fact("zero_stage", "in", [1, 2], 2.0, "ZeRO stage {value} (the races are in ZeRO-1/2)")
NOT_ZERO12 = fact("zero_stage", "in", [0, 3], 0.1, "ZeRO stage {value} has no ZeRO-1/2 reduction race")
OVERLAP_ON = fact("overlap_comm", "==", True, 2.5, "overlap_comm is true")
OVERLAP_OFF = fact("overlap_comm", "==", False, 0.05, "overlap_comm is false: the reduction is serialised")
SINGLE_RANK = fact("world_size", "==", 1, 0.05, "a single rank cannot race on reduction")
# Most pasted DeepSpeed logs show no config dump, so this is no evidence against; but a race needs
# DeepSpeed, and causes whose mechanism the log does show come first.
NO_DEEPSPEED_FACTS = unknown(("deepspeed_version", "zero_stage", "overlap_comm"), 0.3,
                             "nothing in the inputs shows DeepSpeed ZeRO-1/2 (no version, stage or overlap_comm)")
ZERO12_RACE = dict(
    conditions=(NO_DEEPSPEED_FACTS,
                grad_first(2.0, "a ZeRO-1/2 reduction race corrupts the averaged gradient, not the forward pass"),
                loss_first(0.5, "a reduction race shows in the gradient first")),
    decide="the ZeRO stage, overlap_comm and the DeepSpeed version: pass --config ds_config.json and "
           "--env pip-freeze.txt (or a log that holds DeepSpeed's config dump)")
CUDA_ONLY = fact("torch_version", "endswith", "+cpu", 0.05, "torch {value} is a CPU build: no cuDNN kernels")
PRECISION = "the precision: pass --config ds_config.json (its fp16 / bf16 sections) or the training arguments"

CAUSES: tuple[CauseRule, ...] = (
    # Loss normal, then 0.0 with grad_norm nan / a sentinel: the decoder's most frequent cause in public
    # DeepSpeed fine-tuning reports (the ZeRO-1/2 race family), hence the highest of the race priors.
    CauseRule(ds.OVERLAP_RACE, {"nonfinite-hidden": 0.45, "nonfinite": 0.35, "zero-loss": 0.15},
              shown_by=(ZERO12, OVERLAP_ON, *SENTINEL,
                        window_in(ds.OVERLAP_RACE, 3.0, "the IPG double-buffer race (fixed by PR #5606)")),
              ruled_out_by=(NOT_ZERO12, SINGLE_RANK, OVERLAP_OFF, window_out(ds.OVERLAP_RACE, 0.3)),
              conditions=(*ZERO12_RACE["conditions"],
                          fact("communication_data_type", "==", "fp32", 1.5,
                               "communication_data_type fp32 widens the race window"),
                          fact("num_nodes", ">=", 2, 1.5, "{value} nodes: slower communication widens the race "
                                                         "window")),
              decide=ZERO12_RACE["decide"]),
    CauseRule(ds.MULTI_RANK_BUCKET, {"nonfinite-hidden": 0.2, "nonfinite": 0.15},
              shown_by=(ZERO12, *SENTINEL,
                        window_in(ds.MULTI_RANK_BUCKET, 4.0, "the multi-rank bucket path bisected in #5242"),
                        fact("use_multi_rank_bucket_allreduce", "==", True, 1.5,
                             "use_multi_rank_bucket_allreduce is true")),
              ruled_out_by=(NOT_ZERO12, SINGLE_RANK, OVERLAP_OFF, window_out(ds.MULTI_RANK_BUCKET, 0.1),
                            fact("use_multi_rank_bucket_allreduce", "==", False, 0.1,
                                 "use_multi_rank_bucket_allreduce is false")),
              conditions=ZERO12_RACE["conditions"], decide=ZERO12_RACE["decide"]),
    # Three releases only: rare in the field unless the version says so.
    CauseRule(ds.PINGPONG_RESET, {"nonfinite-hidden": 0.05, "nonfinite": 0.05},
              shown_by=(ZERO12, *SENTINEL,
                        window_in(ds.PINGPONG_RESET, 30.0, "the IPG buffer index reset of PR #6993")),
              ruled_out_by=(NOT_ZERO12, SINGLE_RANK, OVERLAP_OFF, window_out(ds.PINGPONG_RESET, 0.01)),
              conditions=ZERO12_RACE["conditions"], decide=ZERO12_RACE["decide"]),
    CauseRule(ds.BUFFER_LIFETIME, {"nonfinite-hidden": 0.1, "nonfinite": 0.1},
              shown_by=(ZERO12, OVERLAP_ON, *SENTINEL,
                        window_in(ds.BUFFER_LIFETIME, 2.5, "no record_stream fix (PR #7965)")),
              ruled_out_by=(NOT_ZERO12, SINGLE_RANK, OVERLAP_OFF, window_out(ds.BUFFER_LIFETIME, 0.05)),
              conditions=(*ZERO12_RACE["conditions"], fact("num_nodes", ">=", 2, 2.0, "{value} nodes")),
              decide=ZERO12_RACE["decide"]),
    # The amplifier: whatever made the first NaN, bf16 ZeRO applied it. Behind many dead bf16 runs.
    CauseRule(ds.BF16_NO_OVERFLOW_CHECK, {"nonfinite-hidden": 0.35, "nonfinite": 0.3},
              shown_by=(fact("bf16", "==", True, 2.0, "bf16 is on"),
                        fact("check_grad_overflow", "==", False, 3.0, "bf16.check_grad_overflow is false"),
                        inside(ds.BF16_NO_OVERFLOW_CHECK.window("deepspeed"), 1.5,
                               "DeepSpeed {value}: bf16 ZeRO skips no step by default (PR #4512; default "
                               "flipped in 0.19.3)")),
              ruled_out_by=(fact("fp16", "==", True, 0.05, "fp16 runs skip overflowing steps"),
                            fact("check_grad_overflow", "==", True, 0.15, "bf16.check_grad_overflow is true")),
              conditions=(unknown(("deepspeed_version", "zero_stage", "bf16"), 0.3,
                                  "nothing in the inputs shows a DeepSpeed bf16 ZeRO run"),
                          fact("zero_stage", "==", 3, 1.5, "ZeRO-3 has no bf16 overflow check at all")),
              decide=f"{PRECISION}, and the DeepSpeed version (--env pip-freeze.txt)"),
    # Every step overflows: the decoder's cause for an overflow storm, and for an LR frozen at its warmup
    # start or a grad_norm of 0.0 from the first step (DeepSpeed logs 0.0 until a step succeeds).
    CauseRule(tr.FP16_ACTIVATION_OVERFLOW, {"fp16-overflow": 0.8, "nonfinite-hidden": 0.05, "lr-zero": 0.3,
                                            "no-grad-flow": 0.1},
              shown_by=(fact("fp16", "==", True, 2.0, "fp16 is on"),
                        event("overflow", 2.0, "{value} loss-scale OVERFLOW lines"),
                        event("scale-at-minimum", 2.0, "the loss scale hit its minimum")),
              ruled_out_by=(fact("bf16", "==", True, 0.1, "the run is bf16: no loss scale, no overflow skip"),
                            fact("fp16", "==", False, 0.1, "fp16 is off: no loss scale, no overflow skip")),
              conditions=(
                  event("lr-before-step", 3.0, "{value} warnings that the optimizer has not stepped yet: every "
                                               "step so far was skipped, as fp16 overflow skips are"),
                  measured("GRAD002", "lr_zero", ">=", 1, 4.0, "grad_norm 0.0 beside a learning rate still at 0: "
                           "DeepSpeed returns before computing the norm when it skips an overflowing step"),
                  measured("LOSS002", "lr_frozen", ">=", 1, 2.0, "the learning rate did not move when the loss "
                           "turned 0.0: the optimizer skipped the step")),
              decide=PRECISION),
    CauseRule(tr.ATTENTION_KERNEL_NAN, {"nonfinite-hidden": 0.1, "nonfinite": 0.12},
              shown_by=(inside(VersionWindow("torch", "2.5.0", "2.5.1"), 5.0,
                               "torch {value} defaults to cuDNN SDPA on H100"),
                        inside(VersionWindow("torch", "2.9.0"), 1.3, "torch {value} re-enabled cuDNN SDPA on SM90/100"),
                        event("cudnn-sdpa", 6.0, "cuDNN SDPA backward warning in the log")),
              ruled_out_by=(CUDA_ONLY,),
              conditions=(unknown(("torch_version",), 0.3, "the torch version is unknown"),
                          onset_at_start(2.0, "NaN from the first logged step: a kernel fails on the first "
                                              "backward"),
                          grad_first(2.0, "the attention kernel's NaN is in the backward pass")),
              decide="the torch version and the attention backend: pass --env pip-freeze.txt, or rerun a few "
                     "steps with torch.backends.cuda.enable_cudnn_sdp(False)"),
    CauseRule(tr.LR_TOO_HIGH, {"divergence": 0.7, "loss-spike": 0.6, "nonfinite": 0.15, "nonfinite-hidden": 0.1},
              shown_by=(fired("LOSS006", 2.0, "a loss spike came before"),
                        fired("LOSS005", 2.0, "the loss diverged"), LOSS_EXPLODED),
              conditions=(onset_at_start(0.5, "trouble from the very first step, before any large update"),
                          steady_before(0.3, "a learning rate too high shows in the loss before it breaks")),
              decide="the loss before the failure: the log from the first step (a spike or a rise before the "
                     "NaN points to the learning rate)"),
    CauseRule(tr.MASKED_BATCH_NAN, {"nonfinite-hidden": 0.1, "nonfinite": 0.1},
              shown_by=(event("tokenization-mismatch", 4.0, "{value} tokenization-mismatch warnings"),
                        event("response-key-missing", 4.0, "{value} 'Could not find response key' warnings"),
                        fired("LABEL001", 3.0, "batches with no supervised token were logged")),
              conditions=(onset_at_start(1.5, "NaN from the first logged step"),
                          grad_first(0.5, "a batch with no label makes the loss itself NaN")),
              decide="the supervised-token count per batch: log (labels != -100).sum() per micro-batch (the "
                     "live guard does)"),
    CauseRule(tr.TEMPLATE_MISMATCH, {"masked-labels": 0.55, "zero-loss": 0.35},
              shown_by=(event("tokenization-mismatch", 5.0, "{value} 'tokenization mismatch' warnings"),),
              conditions=(
                  fired("LOSS002", 0.3, "the loss was normal before it fell to 0.0: masking in preprocessing shows "
                                        "from the first step"),
                  onset_at_start(4.0, "the loss is 0.0 from the first steps on, as when every sample's labels "
                                      "are masked")),
              decide="which tokens are supervised: decode one batch where labels != -100 and check it is the "
                     "assistant turn (a 'tokenization mismatch' warning in the log would decide)"),
    CauseRule(tr.TRUNCATION_CUTS_ANSWERS, {"masked-labels": 0.35, "zero-loss": 0.25},
              shown_by=(event("response-key-missing", 5.0, "{value} 'Could not find response key' warnings"),),
              conditions=(fired("LOSS002", 0.3, "the loss was normal before it fell to 0.0: masking in "
                                                "preprocessing shows from the first step"),),
              decide="the tokenized lengths against max_length / cutoff_len (a histogram of one epoch)"),
    CauseRule(tr.IMAGE_TOKEN_MISMATCH, {"masked-labels": 0.05, "zero-loss": 0.05},
              shown_by=(event("image-token-mismatch", 40.0, "{value} image-token mismatch warnings"),),
              decide="the image-token count per sample against the vision embeddings"),
    CauseRule(tr.LORA_REENTRANT, {"no-grad-flow": 0.55, "not-learning": 0.3},
              shown_by=(event("no-input-grad", 3.0, "PyTorch warned 'None of the inputs have requires_grad=True'"),
                        event("reentrant-checkpoint", 1.5, "reentrant checkpointing warning"),
                        fact("gradient_checkpointing", "==", True, 2.0, "gradient checkpointing on")),
              ruled_out_by=(fact("gradient_checkpointing", "==", False, 0.1, "gradient checkpointing is off"),),
              conditions=(measured("GRAD002", "lr_zero", ">=", 1, 0.2, "the learning rate is 0 beside the 0.0 "
                                   "norm: a skipped step's norm, not a missing gradient"),),
              decide="whether gradient checkpointing is on with LoRA: the training arguments, or the log's "
                     "'None of the inputs have requires_grad=True' warning"),
    CauseRule(tr.TRAINABLE_NOT_OPTIMIZED, {"no-grad-flow": 0.45, "not-learning": 0.35},
              shown_by=(event("trainable-not-in-optimizer", 10.0, "parameters outside the optimizer"),
                        fired("GRAD003", 5.0, "the Trainer reports 0 trainable parameters")),
              conditions=(measured("GRAD002", "lr_zero", ">=", 1, 0.2, "the learning rate is 0 beside the 0.0 "
                                   "norm: a skipped step's norm, not a missing gradient"),),
              decide="the trainable parameters against the optimizer's: the Trainer's 'Number of trainable "
                     "parameters' line, or the live guard (it compares them)"),
    # LR 0 on every log: the scheduler has not moved (a warmup longer than the run, a scheduler stepped per
    # epoch, or no optimizer step taken). Nothing in a log shows the scheduler's settings, so never likely.
    CauseRule(tr.SCHEDULER_NOT_STEPPING, {"lr-zero": 0.6},
              conditions=(event("lr-before-step", 1.5, "{value} warnings that the scheduler has not stepped"),
                          event("overflow", 0.3, "{value} OVERFLOW lines: the steps are skipped by the loss "
                                                 "scaler, the scheduler is not at fault")),
              decide="the scheduler settings (warmup_steps / warmup_ratio against max_steps) in the training "
                     "arguments"),
    CauseRule(tr.LR_TOO_SMALL, {"not-learning": 0.4, "lr-zero": 0.2},
              conditions=(event("lr-before-step", 0.5, "the optimizer had not stepped: the LR is 0 because no "
                                                       "step was taken, not because it is small"),),
              decide="the learning-rate schedule: the logged learning rate over the whole run"),
    CauseRule(tr.WEIGHTS_NOT_UPDATING, {"not-learning": 0.35, "zero-loss": 0.05},
              shown_by=(fired("LR001", 3.0, "the learning rate is 0"),),
              decide="whether the weights change: the learning rate in the log, or the live guard's update ratio"),
    CauseRule(tr.LABEL_LEAKAGE, {"memorization": 0.25},
              shown_by=(inside(tr.LABEL_LEAKAGE.window("transformers"), 4.0,
                               "transformers {value}: Gemma-2 4-D mask bug (#31673)"),
                        measured("LOSS007", "eval_ratio", "<=", 0.5, 12.0,
                                 "eval_loss fell too ({value:.2f} of the initial loss): held-out data is predicted "
                                 "as well as training data, so the answers are visible")),
              ruled_out_by=(measured("LOSS007", "eval_ratio", ">=", 1.0, 0.2,
                                     "eval_loss rose ({value:.2f} of the initial loss): the answers are not "
                                     "visible"),),
              decide="the evaluation loss: log eval_loss (eval_strategy steps)"),
    CauseRule(tr.BENIGN_MEMORIZATION, {"memorization": 0.75},
              shown_by=(measured("LOSS007", "eval_ratio", ">=", 1.0, 3.0,
                                 "eval_loss ({value:.2f} of the initial loss) rose while the training loss "
                                 "vanished: overfitting a small dataset"),),
              decide="the evaluation loss: log eval_loss (eval_strategy steps)"),
    CauseRule(tr.REPLICA_DIVERGENCE, {"rank-desync": 1.0},
              shown_by=(fired("RANK001", 2.0, "the ranks' weight fingerprints or losses differ"),),
              decide="per-rank weight checksums at the onset step (the live guard compares them)"),
    CauseRule(tr.NUMERICAL_INSTABILITY, {"nonfinite": 0.3, "nonfinite-hidden": 0.2, "divergence": 0.3,
                                          "zero-loss": 0.1},
              shown_by=(fact("fp16", "==", True, 2.0, "fp16 is on: activations above 65504 overflow"),
                        event("overflow", 1.5, "{value} loss-scale OVERFLOW lines"),
                        fired("LOSS006", 1.5, "a loss spike came first"),
                        fired("LOSS005", 1.5, "the loss diverged first"), LOSS_EXPLODED),
              ruled_out_by=(measured("LOSS001", "on_eval", ">=", 1, 0.2,
                                     "only the evaluation loss is non-finite: training is finite"),),
              conditions=(
                  measured("LOSS002", "lr_frozen", ">=", 1, 2.0,
                           "the learning rate did not move at that log: the optimizer skipped the step"),
                  onset_at_start(0.6, "trouble from the first steps, before any large update"),
                  steady_before(0.5, "an unstable update or an overflow building up shows in the loss first"),
                  grad_first(0.5, "numerical overflow in the forward pass makes the loss non-finite first")),
              decide=f"{PRECISION}, and the loss before the NaN (a spike or rise before it points to the "
                     "learning rate)"),
    # An evaluation loss averages over supervised tokens: one eval batch (or shard) with none is 0/0. Rare
    # behind a NaN in general (a small prior); the log's own fact, NaN in evaluation only, decides it.
    CauseRule(tr.EVAL_ONLY_NAN, {"nonfinite": 0.02},
              shown_by=(measured("LOSS001", "on_eval", ">=", 1, 50.0,
                                 "the evaluation loss is non-finite while training logs stay finite"),),
              decide="the supervised-token count per evaluation batch"),
    # Both RL causes apply only to RL trainers' logs (reward columns): small priors, decided by GRAD006's
    # reading of the rewards beside the zero gradient.
    CauseRule(tr.RL_DEGENERATE_REWARDS, {"no-grad-flow": 0.02, "not-learning": 0.02},
              shown_by=(measured("GRAD006", "degenerate_rewards", ">=", 1, 100.0,
                                 "an RL step with zero gradient whose groups all have identical rewards "
                                 "(reward_std 0)"),),
              ruled_out_by=(measured("GRAD006", "degenerate_rewards", "<=", 0, 0.05,
                                     "the rewards vary inside the groups, so the advantages are not all 0"),),
              decide="the reward standard deviation per group (reward_std, frac_reward_zero_std)"),
    CauseRule(tr.RL_UPDATE_LOST, {"no-grad-flow": 0.02},
              shown_by=(measured("GRAD006", "degenerate_rewards", "<=", 0, 100.0,
                                 "an RL step with zero gradient although the rewards vary (reward_std > 0)"),),
              ruled_out_by=(measured("GRAD006", "degenerate_rewards", ">=", 1, 0.1,
                                     "every group's rewards are identical: a zero gradient is expected"),),
              decide="the reward standard deviation per group (reward_std, frac_reward_zero_std)"),
)

if len({c.id for c in CAUSES}) != len(CAUSES):
    raise ValueError("a known issue is ranked twice in the cause catalog")
