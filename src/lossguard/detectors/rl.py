"""GRAD006: an RL trainer's zero update (GRPO/PPO: reward and KL in the log, grad_norm exactly 0)."""

from __future__ import annotations

from lossguard.core.column_tests import nonzero
from lossguard.core.findings import Finding, Severity
from lossguard.core.records import TRAIN, Record
from lossguard.detectors._base import DetectorBase, is_rl
from lossguard.detectors.registry import register


@register
class RlZeroUpdate(DetectorBase):
    """GRAD006: an RL trainer (GRPO/PPO: reward and KL in the log) reports a gradient norm of exactly 0: the
    step changes nothing. When every group's rewards are equal (`reward_std` 0, `frac_reward_zero_std` 1),
    every group-normalised advantage is 0 and so is the policy gradient (with beta 0 there is no KL term
    either): fix the reward functions or sampling (more generations per prompt, a higher temperature,
    rewards that tell completions apart). When the rewards do vary, the gradient was lost on its way to
    the weights: frozen or untracked parameters, or an old DeepSpeed ZeRO version; upgrade DeepSpeed and
    check which parameters require grad."""

    wants = frozenset({"grad_norm"})
    spared_when = {"grad_norm": nonzero}
    predicts = {
        "grad_norm": "exactly 0 as the run's state: log after log to the end of the log (a norm that is 0 in a "
                     "few logs among non-zero ones is an event, one group's batch, not the run's state)",
        "reward_std": "0, or frac_reward_zero_std 1 (degenerate rewards), or varying (the gradient is lost); "
                      "absent: the two readings stay open",
        "reward": "no trend: a policy that is not updated does not improve",
        "kl": "0 or constant (the policy stays the reference)",
        "loss": "0.0 or beta * KL (an RL loss is no cross-entropy)",
        "lr": "anything",
    }
    demoted = Severity.WARNING  # the zero updates happened: an episode worth a look
    code = "GRAD006"
    name = "rl.zero-update"
    signature = "no-grad-flow"
    severity = Severity.ERROR

    def observe(self, record: Record) -> list[Finding]:
        if record.kind != TRAIN or record.signals.get("grad_norm") != 0.0 or not is_rl(record):
            return []
        std, zero_std = record.signals.get("reward_std"), record.signals.get("frac_reward_zero_std")
        if std == 0.0 or zero_std == 1.0:
            # Only one of the two may be logged (TRL logs frac_reward_zero_std, others reward_std).
            shown = f"reward_std {std:g}" if std is not None else f"frac_reward_zero_std {zero_std:g}"
            return self.emit(
                f"grad_norm is exactly 0 at step {record.step} and every group's rewards are equal ({shown}): "
                "every advantage is 0, so the policy gradient vanishes and the step changes nothing",
                record.step, record.rank, degenerate_rewards=1)
        if std is None and zero_std is None:
            # Nothing says whether the groups' rewards differed: both readings stay open, and the report asks
            # for the column that decides (the measurement is left unknown, never taken as "they vary").
            return self.emit(
                f"grad_norm is exactly 0 at step {record.step}: the step changes nothing; the log has no "
                "reward_std or frac_reward_zero_std to tell equal rewards in every group (every advantage 0) "
                "from a gradient lost on its way to the weights", record.step, record.rank)
        shown = f"reward_std {std:g}" if std is not None else f"frac_reward_zero_std {zero_std:g}"
        return self.emit(
            f"grad_norm is exactly 0 at step {record.step} although the rewards vary ({shown}): the policy "
            "gradient never reaches the trainable weights (frozen parameters, or an engine bug such as an old "
            "DeepSpeed ZeRO version)", record.step, record.rank, degenerate_rewards=0)

    def contradiction(self) -> str | None:
        rank = self.fired.rank
        logged, last = self.counts.seq(rank, "grad_norm"), self.counts.last(rank, "grad_norm")
        if last is None or last == 0.0 or not 2 * self.count < logged:
            return None
        return (f"grad_norm is 0 in {self.count} of the {logged} logs and non-zero in the last one: the zero "
                "updates are an event (a batch whose groups all scored alike), not the run's state")
