"""The signal catalog: canonical names, what they mean, and the source names that map onto them."""

from __future__ import annotations

import re

# name -> meaning. Detectors, reports and the live monitor use only these names.
SIGNALS: dict[str, str] = {
    "loss": "training loss as logged (after the Trainer's NaN filter unless `raw_loss` exists)",
    "raw_loss": "training loss before any logging filter (live monitor only)",
    "other_loss": "another loss column of the same log (a progress bar's `loss` beside `reduced_train_loss`), "
                  "kept only when it is NaN/Inf: a reader's choice of column never hides a NaN",
    "grad_norm": "global gradient norm (DeepSpeed's when it exists; may be a sentinel)",
    "lr": "learning rate of the first param group",
    "loss_scale": "fp16 dynamic loss scale",
    "num_label_tokens": "supervised tokens (labels != -100 after the shift) in the step",
    "min_label_tokens": "smallest supervised-token count of any rank's micro-batch in the step",
    "skipped_steps": "cumulative optimizer steps skipped (overflow)",
    "param_fingerprint": "weight fingerprint of a rank's replica",
    "eval_loss": "evaluation loss",
    "epoch": "fractional epoch",
    "update_ratio": "largest |update| / |weight| of any module group",
    "grad_norm_unclipped": "gradient norm before clipping",
    "step_time_s": "seconds per optimizer step",
    # RL trainers (TRL GRPO/PPO/DPO, ms-swift, OpenRLHF): their loss can be legitimately 0.0 at the start.
    "reward": "mean reward of the step's completions (RL)",
    "reward_std": "standard deviation of the rewards within a group (GRPO: 0 means zero advantages)",
    "frac_reward_zero_std": "fraction of groups whose rewards are all equal (GRPO: no learning signal)",
    "kl": "KL divergence to the reference policy (RL)",
    "reward_margin": "chosen minus rejected reward (DPO)",
    "reward_accuracy": "share of pairs where the chosen reward beats the rejected one (DPO)",
    # TRL's SFT logs 0.0 when no token of the batch is supervised (it divides by the valid tokens only then).
    "token_accuracy": "share of supervised tokens predicted right (TRL's mean_token_accuracy)",
}

# Source key (lower-cased, stripped) -> canonical name. One table for every format.
ALIASES: dict[str, str] = {
    "loss": "loss",
    "train_loss": "loss",
    "train/loss": "loss",
    "lm loss": "loss",
    "lm_loss": "loss",
    "total_loss": "loss",
    "raw_loss": "raw_loss",
    "other_loss": "other_loss",
    "grad_norm": "grad_norm",
    "grad norm": "grad_norm",
    "gradient_norm": "grad_norm",
    "train/grad_norm": "grad_norm",
    "learning_rate": "lr",
    "learning rate": "lr",
    "lr": "lr",
    "train/learning_rate": "lr",
    "train/lr": "lr",
    "loss_scale": "loss_scale",
    "loss scale": "loss_scale",
    "train/loss_scale": "loss_scale",
    "number of skipped iterations": "skipped_steps",
    "skipped_steps": "skipped_steps",
    "skipped": "skipped_steps",
    "num_label_tokens": "num_label_tokens",
    "min_label_tokens": "min_label_tokens",
    "eval_loss": "eval_loss",
    "eval/loss": "eval_loss",
    "validation loss": "eval_loss",
    "val_loss": "eval_loss",
    "valid loss": "eval_loss",
    "valid_loss": "eval_loss",
    "val/loss": "eval_loss",
    "validation/loss": "eval_loss",
    "gnorm": "grad_norm",
    "train/gnorm": "grad_norm",
    "reward": "reward",
    "train/reward": "reward",
    "rewards/mean": "reward",
    "reward_std": "reward_std",
    "train/reward_std": "reward_std",
    "rewards/std": "reward_std",
    "frac_reward_zero_std": "frac_reward_zero_std",
    "kl": "kl",
    "train/kl": "kl",
    "objective/kl": "kl",
    "rewards/margins": "reward_margin",
    "train/rewards/margins": "reward_margin",
    "rewards/accuracies": "reward_accuracy",
    "mean_token_accuracy": "token_accuracy",
    "train/mean_token_accuracy": "token_accuracy",
    "token_acc": "token_accuracy",
    "train/token_acc": "token_accuracy",
    "train/rewards/accuracies": "reward_accuracy",
    "epoch": "epoch",
    "train/epoch": "epoch",
    "update_ratio": "update_ratio",
    "param_fingerprint": "param_fingerprint",
    "param_sum": "param_fingerprint",
    "weight_sum": "param_fingerprint",
    "fingerprint": "param_fingerprint",
}

STEP_KEYS = ("step", "global_step", "iteration", "iter", "current_steps", "train/global_step")


# The run's gradient norm and learning rate under the other names tools give them: OLMo's
# `optim/total_grad_norm`, verl's `actor/grad_norm` and `actor/lr`, Lightning's LearningRateMonitor `lr-AdamW`,
# Composer's `lr-DecoupledAdamW/group0`, `learning_rate_group0`. The whole name must match, so a per-layer norm
# (`grad_norm/layer.3`) or a later param group's LR (`lr-AdamW/pg2`) is never read as the run's.
_GRAD_NORM_NAME = re.compile(r"(?:[\w.-]+/)*(?:total_|global_)?(?:grad_norm|grad-norm|gradnorm|gradient_norm|gnorm)(?:/total)?")
# `lr-<Optimizer>` is Lightning's / Composer's name; `lr-decay`, `lr-warmup`, `lr-min` (argument dumps) are not LRs.
_LR_NAME = re.compile(r"(?:[\w.-]+/)*(?:lr|learning_rate)(?:[-_](?:group_?0|pg_?0|pg1|0)|"
                      r"-(?!decay|warmup|sched|min|max|init|final|scale|ratio|mult|end|start|peak|step)[a-z]\w*"
                      r"(?:/(?:group_?0|pg1))?)?")


def canonical(key: str) -> str | None:
    """Canonical signal name for a source key, or None when it is not a signal we track."""
    key = key.strip().lower()
    name = ALIASES.get(key)
    if name is None and ("norm" in key or "lr" in key or "learning_rate" in key):
        if _GRAD_NORM_NAME.fullmatch(key):
            return "grad_norm"
        if _LR_NAME.fullmatch(key):
            return "lr"
    return name


def to_float(value: object) -> float | None:
    """A logged value as float: numbers, numeric strings ('4.714', 'nan', 'NaN', 'inf'), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        try:
            return float(text)
        except ValueError:
            return None
    return None
