"""Healthy twins (issue 31): every rule that can call a run broken has a twin that shares its symptom and
trains, and reads healthy or warning, while the matching death still reads broken. A rule checks the other
columns (its `predicts` table) and stays quiet when one contradicts it.

Real twins are the logs of tests/fixtures/twins/ (real tiny `transformers.Trainer` / PyTorch runs on CPU,
written by tests/fixtures/twins/make_twins.py); the others are scripted here in the format the real tool
prints, and say so."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from lossguard.api import analyze
from lossguard.detectors import make_detectors
from lossguard.diagnose.signatures import SIGNATURES

TWINS_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "twins"


def _analyze(tmp_path, text: str, name: str = "train.log"):
    log = tmp_path / name
    log.write_text(text)
    return analyze([log])


def _rows(dicts) -> str:
    return "".join(repr(d) + "\n" for d in dicts)


def _codes(diagnosis) -> dict:
    return {f.code: str(f.severity) for f in diagnosis.findings}


def _train_loss(values, **columns):
    return [{"loss": v, **{k: (c(i) if callable(c) else c) for k, c in columns.items()}, "epoch": i / 10}
            for i, v in enumerate(values)]


# -- GRAD002: grad_norm 0 beside a loss that falls (real run) -----------------------------------------------

@pytest.mark.parametrize("name", ["train.log", "trainer_state.json"])
def test_grad002_twin_real_layerwise_optimizer_reads_healthy(name):
    """Real: per-parameter AdamW stepped in post-accumulate-grad hooks; the Trainer logs grad_norm 0."""
    d = analyze([TWINS_DIR / "layerwise" / name])
    assert d.verdict in ("healthy", "warning"), (d.verdict, d.signature)
    assert _codes(d).get("GRAD002") == "info"  # the symptom is seen, and contradicted by the falling loss


def test_grad002_death_grad_zero_beside_a_loss_that_only_wanders_is_broken(tmp_path):
    """Scripted (HF 4.x dict lines): nothing trains, the loss wanders with the batches around one level."""
    losses = [2.1 + 0.08 * math.sin(3 * i) for i in range(30)]
    d = _analyze(tmp_path, _rows(_train_loss(losses, grad_norm=0.0, learning_rate=1e-4)))
    assert (d.verdict, d.signature) == ("broken", "no-grad-flow")


# -- LR002 / LR001: an LR at 0 at the end of a schedule --------------------------------------------------

def test_lr_twin_real_linear_schedule_to_zero_on_a_memorising_run_reads_healthy():
    """Real: a plain loop, linear schedule to 0, four samples memorised; its last log prints LR 0.0."""
    d = analyze([TWINS_DIR / "memorise" / "train.log"])
    assert d.verdict == "healthy" and d.signature in (None, "memorization"), (d.verdict, d.signature)


def test_lr002_twin_schedule_end_with_a_loss_rounded_to_zero_is_memorization(tmp_path):
    """Scripted (HF 4.x: round(loss, 4), the LR after scheduler.step()): a loss that decays to 0.0 as its
    linear schedule reaches 0."""
    n = 30
    rows = [{"loss": round(2.5 * 0.6 ** i, 4), "grad_norm": 3.0 * 0.7 ** i, "learning_rate": 5e-4 * (1 - (i + 1) / n),
             "epoch": (i + 1) / n * 10} for i in range(n)]
    assert rows[-1]["loss"] == 0.0 and rows[-1]["learning_rate"] == 0.0
    d = _analyze(tmp_path, _rows(rows))
    assert (d.verdict, d.signature) == ("healthy", "memorization")
    assert _codes(d).get("LR002") == "info"


def test_lr002_death_loss_and_lr_zero_from_the_first_log_is_broken(tmp_path):
    d = _analyze(tmp_path, _rows([{"loss": 0.0, "learning_rate": 0.0, "epoch": i / 10} for i in range(1, 4)]))
    assert d.verdict == "broken" and "LR002" in _codes(d)


def test_lr001_twin_an_lr_rounded_to_zero_by_its_print_while_the_loss_moves(tmp_path):
    """Scripted (a four-decimal print, as LLaMA-Factory-style logs round): a decaying LR reaches 0.0001
    and then prints 0.0000 for its last logs while the loss moves."""
    rows = _train_loss([2.0 - 0.04 * i + 0.03 * math.sin(i) for i in range(24)], grad_norm=1.0,
                       learning_rate=lambda i: round(2e-4 * (1 - i / 22), 4))
    assert [r["learning_rate"] for r in rows[-3:]] == [0.0, 0.0, 0.0]
    d = _analyze(tmp_path, _rows(rows))
    assert d.verdict in ("healthy", "warning"), (d.verdict, d.signature, _codes(d))


def test_lr001_death_an_lr_at_zero_from_the_start_to_the_end_while_the_loss_is_flat(tmp_path):
    """Scripted: the scheduler never steps, the LR is 0 in every log and the loss only wanders."""
    losses = [2.0 + 0.01 * math.sin(i) for i in range(12)]
    d = _analyze(tmp_path, _rows(_train_loss(losses, grad_norm=1.0, learning_rate=0.0)))
    assert (d.verdict, d.signature) == ("broken", "lr-zero")


# -- GRAD006: one GRPO group with identical rewards --------------------------------------------------------

def _grpo(zero_at):
    rows = []
    for i in range(21):
        zero = i in zero_at
        rows.append({"loss": 0.0 if zero else 0.001 * i, "grad_norm": 0.0 if zero else 0.5 + i / 50,
                     "learning_rate": 1e-6, "reward": 0.5 if zero else 0.3 + i / 100,
                     "reward_std": 0.0 if zero else 0.2, "frac_reward_zero_std": 1.0 if zero else 0.1,
                     "kl": 0.001 * i, "epoch": i / 21})
    return _rows(rows)


def test_grad006_twin_one_grpo_record_with_equal_rewards_is_an_event(tmp_path):
    """Scripted (TRL GRPO's logged keys): one step whose groups all scored alike, among twenty that train."""
    d = _analyze(tmp_path, _grpo({10}))
    assert d.verdict in ("healthy", "warning")
    assert _codes(d)["GRAD006"] == "warning"


def test_grad006_death_every_grpo_record_with_equal_rewards_is_broken(tmp_path):
    d = _analyze(tmp_path, _grpo(set(range(21))))
    assert (d.verdict, d.signature) == ("broken", "no-grad-flow")


def test_grad006_without_reward_spread_columns_says_neither_reading(tmp_path):
    """A GRPO log with reward and KL but no reward_std / frac_reward_zero_std: nothing says whether the rewards
    varied, so the finding must not claim they did, and no RL cause is decided (the report asks for them)."""
    rows = [{"loss": 0.0, "grad_norm": 0.0, "learning_rate": 1e-6, "reward": 0.4 + (i % 3) / 10,
             "kl": 0.0, "epoch": i / 21} for i in range(21)]
    d = _analyze(tmp_path, _rows(rows))
    assert (d.verdict, d.signature) == ("broken", "no-grad-flow")
    text = next(f.message for f in d.findings if f.code == "GRAD006")
    assert "vary" not in text and "reward_std" in text, text
    rl = [c for c in d.causes if c.id in ("rl-zero-advantage", "rl-update-lost")]
    assert rl and all(c.likelihood != "likely" for c in rl), [(c.id, c.likelihood) for c in d.causes]
    assert all("reward_std" in c.decide for c in rl), [c.decide for c in rl]


# -- LOSS010: a plateau at ln 10 that is no 10-way guess -------------------------------------------------------

def test_loss010_twin_an_lm_plateau_at_ln_10_logged_mid_run_is_not_chance(tmp_path):
    """Scripted (HF dicts with step numbers): an LM pre-training plateau at 2.30 from step 5000."""
    rows = [{"loss": round(math.log(10) * (1 + 0.0015 * math.sin(i)), 4), "grad_norm": 0.3 + i / 100,
             "learning_rate": 1e-4, "step": 5000 + 10 * i} for i in range(20)]
    d = _analyze(tmp_path, _rows(rows))
    assert d.verdict in ("healthy", "warning"), (d.verdict, d.signature)


def test_loss010_death_a_loss_at_ln_4_from_the_first_step_is_broken(tmp_path):
    rows = [{"loss": round(math.log(4) * (1 + 1e-3 * math.sin(i)), 4), "learning_rate": 1e-5, "step": 10 * i + 10}
            for i in range(12)]
    d = _analyze(tmp_path, _rows(rows))
    assert (d.verdict, d.signature) == ("broken", "not-learning")


# -- LOSS004: DPO at ln 2 -----------------------------------------------------------------------------------

def _dpo(dead: bool):
    return _rows({"loss": 0.6931 if dead else round(0.6931 - 0.012 * i, 4), "grad_norm": 1.2 + i / 10,
                  "learning_rate": 5e-7, "rewards/chosen": 0.0 if dead else 0.01 * i,
                  "rewards/rejected": 0.0 if dead else -0.01 * i, "rewards/margins": 0.0 if dead else 0.02 * i,
                  "rewards/accuracies": 0.0 if dead else 0.5 + i / 50, "epoch": i / 20} for i in range(20))


def test_loss004_twin_a_dpo_loss_that_leaves_ln_2_reads_healthy(tmp_path):
    """Scripted (TRL DPOTrainer's keys): a pairwise loss starts at ln 2 by construction and leaves it."""
    assert _analyze(tmp_path, _dpo(dead=False)).verdict == "healthy"


def test_loss004_death_a_dpo_policy_identical_to_its_reference_is_broken(tmp_path):
    """ln 2 with rewards/chosen, rejected and margins exactly 0 on every log: the policy is its reference."""
    d = _analyze(tmp_path, _dpo(dead=True))
    assert (d.verdict, d.signature) == ("broken", "not-learning")


# -- LOSS005: a loss that jumps far above its start ----------------------------------------------------------

def _overshoot(recovers: bool):
    """HF 4.x dict lines: a fine-tune whose loss falls from 2.6, an LR warmup that ends too high throws the
    loss up to 5-8 for eight logs; then either the decaying LR brings it back down under its start and it
    keeps falling, or the weights sit at chance (ln 64 for a 64-token vocabulary) to the end."""
    before = [2.6 - 0.1 * i for i in range(10)]
    jump = [5.0 + 3 * math.sin(i) ** 2 for i in range(8)]
    after = ([1.4 - 0.02 * i + 0.03 * math.sin(i) for i in range(16)] if recovers else
             [math.log(64) + 0.01 * math.sin(i) for i in range(16)])
    lrs = [2e-4 * (i + 1) / 12 if i < 12 else 2e-4 * (34 - i) / 22 for i in range(34)]
    return _rows({"loss": round(v, 4), "grad_norm": 40.0 if 10 <= i < 18 else 1.5, "learning_rate": lrs[i],
                  "epoch": i / 34} for i, v in enumerate(before + jump + after))


def test_loss005_twin_a_warmup_overshoot_that_comes_back_down_is_no_divergence(tmp_path):
    """Scripted (HF 4.x dicts): the loss jumps at the end of warmup and comes back under its start."""
    d = _analyze(tmp_path, _overshoot(recovers=True))
    assert d.verdict in ("healthy", "warning"), (d.verdict, d.signature, _codes(d))
    assert _codes(d).get("LOSS005") == "warning"  # the jump is seen, and contradicted by the way back


def test_loss005_death_a_jump_that_settles_at_chance_is_broken(tmp_path):
    """Under twice the run's start (so no longer 'high') but at chance, never back where it started."""
    d = _analyze(tmp_path, _overshoot(recovers=False))
    assert (d.verdict, d.signature) == ("broken", "divergence"), _codes(d)


# -- LABEL001 / LOSS003: a loss of exactly 0 -------------------------------------------------------------------

def _four_decimals(losses, grads):
    """A custom loop's print, four decimals each (nanoGPT-style `loss {loss:.4f}`), read by the generic reader."""
    return "".join(f"step {20 * (i + 1):5d} | loss {loss:.4f} | grad_norm {grad:.4f} | lr {3e-3:.2e}\n"
                   for i, (loss, grad) in enumerate(zip(losses, grads)))


def test_label001_twin_a_memorised_model_whose_loss_and_norm_shrink_to_a_printed_zero(tmp_path):
    """Scripted (a custom loop printing four decimals): a memorising run's loss and gradient norm decay
    through 0.0100, 0.0011, 0.0001 until both print 0.0000."""
    d = _analyze(tmp_path, _four_decimals([2.8 * 0.7 ** i for i in range(40)], [4.0 * 0.72 ** i for i in range(40)]))
    assert (d.verdict, d.signature) == ("healthy", "memorization"), _codes(d)
    assert _codes(d).get("LABEL001") == "info"  # both print 0: seen, and contradicted by the decay into them


def test_label001_death_loss_and_norm_jump_straight_to_zero_is_broken(tmp_path):
    """The same print: the loss falls a little, then a masking preprocessing stage takes it straight to 0."""
    losses = [2.8 - 0.05 * i if i < 6 else 0.0 for i in range(40)]
    d = _analyze(tmp_path, _four_decimals(losses, [3.0 if i < 6 else 0.0 for i in range(40)]))
    assert (d.verdict, d.signature) == ("broken", "masked-labels"), _codes(d)


def _llamafactory_log(first_step: int) -> str:
    """LLaMA-Factory's trainer_log.jsonl (no grad_norm): twelve logs of loss 0.0 from `first_step`."""
    import json

    rows = [{"current_steps": first_step + 10 * i, "total_steps": 5000, "loss": 0.0,
             "lr": round(1e-5 * (1 - (first_step + 10 * i) / 5000), 10), "epoch": round((first_step + 10 * i) / 200, 2),
             "percentage": round((first_step + 10 * i) / 50, 2), "elapsed_time": "1:00:00",
             "remaining_time": "0:40:00"} for i in range(12)]
    return "".join(json.dumps(row) + "\n" for row in rows)


def test_loss003_twin_the_pasted_tail_of_a_memorised_run_is_a_warning(tmp_path):
    """Scripted (LLaMA-Factory's trainer_log.jsonl): the last lines of a run that memorised its data, from
    step 3000; its rounded loss prints 0.0 and the log does not show where the zeros began."""
    d = _analyze(tmp_path, _llamafactory_log(3000), "trainer_log.jsonl")
    assert d.verdict == "warning" and _codes(d).get("LOSS003") == "warning", _codes(d)


def test_loss003_death_zeros_from_the_first_step_are_broken(tmp_path):
    d = _analyze(tmp_path, _llamafactory_log(10), "trainer_log.jsonl")
    assert (d.verdict, d.signature) == ("broken", "zero-loss"), _codes(d)


# -- LOSS001 / LOSS002 / SCALE001: skipped fp16 steps, a window or to the end --------------------------------

def _skips(window, to_the_end: bool) -> str:
    """HF 4.x dicts of an fp16 run (logging_steps=1): on the skipped steps the forward pass overflowed, so the
    NaN filter prints loss 0.0, grad_norm is nan and the LR holds (the scheduler steps only on applied
    steps); after a window the scaler has found a scale and training goes on, or the skips last to the end."""
    rows, lr = [], 0.0
    for i in range(30):
        skip = i in window or (to_the_end and i >= min(window))
        lr = lr if skip else 2e-5 * min(1.0, (i + 1) / 5) * (1 - i / 40)
        rows.append({"loss": 0.0 if skip else round(2.2 - 0.03 * i + 0.05 * math.sin(i), 4),
                     "grad_norm": math.nan if skip else round(1.3 + 0.2 * math.sin(i), 4),
                     "learning_rate": lr, "epoch": round(i / 30, 2)})
    return _rows(rows)


def test_loss001_loss002_scale001_twin_a_window_of_skipped_steps_then_training_is_a_warning(tmp_path):
    """Scripted (HF 4.x dicts): three skipped steps mid-run, then fifteen logs that train."""
    d = _analyze(tmp_path, _skips({12, 13, 14}, to_the_end=False))
    assert d.verdict == "warning", (d.verdict, d.signature, _codes(d))
    assert {c: _codes(d).get(c) for c in ("LOSS001", "LOSS002", "SCALE001")} == dict.fromkeys(
        ("LOSS001", "LOSS002", "SCALE001"), "warning")  # each saw the window, and the training after it


def test_loss001_loss002_scale001_death_skips_to_the_end_are_broken(tmp_path):
    d = _analyze(tmp_path, _skips({12, 13, 14}, to_the_end=True))
    assert d.verdict == "broken", _codes(d)
    assert {c: _codes(d).get(c) for c in ("LOSS001", "LOSS002", "SCALE001")} == dict.fromkeys(
        ("LOSS001", "LOSS002", "SCALE001"), "critical")


def test_loss001_twin_an_isolated_skip_with_a_held_lr_reads_healthy_or_warning(tmp_path):
    """Scripted (HF 4.x dicts): one step's gradient overflowed (grad_norm inf beside a finite loss, the LR
    held), then normal training."""
    rows = _train_loss([2.2 - 0.03 * i + 0.05 * math.sin(i) for i in range(30)],
                       grad_norm=lambda i: math.inf if i == 12 else 1.3, learning_rate=lambda i: 2e-5 * (1 - max(i, 13) / 40)
                       if i >= 12 else 2e-5 * (1 - i / 40))
    d = _analyze(tmp_path, _rows(rows))
    assert d.verdict in ("healthy", "warning"), (d.verdict, d.signature, _codes(d))


def _overflow_log(burst_to_the_end: bool) -> str:
    """DeepSpeed's OVERFLOW lines beside HF 4.x dicts: four skips while the scale calibrates from 2^16,
    then a burst of four mid-run (one bad batch region) after which training goes on, or skips to the end."""
    lines, scale = [], 65536
    for i in range(40):
        skip = i < 4 or 20 <= i < 24 or (burst_to_the_end and i >= 20)
        if skip:
            lines.append(f"[2024-05-01 10:00:{i:02d},000] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] "
                         f"OVERFLOW! Rank 0 Skipping step. Attempted loss scale: {scale}, reducing to {max(scale // 2, 1)}")
            scale = max(scale // 2, 1)
        lines.append(repr({"loss": round(2.3 - 0.02 * i + 0.03 * math.sin(i), 4),
                           "grad_norm": math.nan if skip else round(1.1 + 0.1 * math.sin(i), 4),
                           "learning_rate": 2e-5, "epoch": round(i / 40, 3)}))
    return "\n".join(lines) + "\n"


def test_scale001_twin_a_scale_that_recalibrates_after_a_burst_of_overflows_is_a_warning(tmp_path):
    """Scripted (DeepSpeed OVERFLOW lines, HF 4.x dicts): the scale settles and the loss keeps falling."""
    d = _analyze(tmp_path, _overflow_log(burst_to_the_end=False))
    assert d.verdict in ("healthy", "warning") and _codes(d).get("SCALE001") == "warning", (d.verdict, _codes(d))


def test_scale001_death_overflows_on_every_step_to_the_end_are_broken(tmp_path):
    d = _analyze(tmp_path, _overflow_log(burst_to_the_end=True))
    assert (d.verdict, d.signature) == ("broken", "fp16-overflow"), _codes(d)


# -- GRAD001: a grad norm of exactly 1.0 --------------------------------------------------------------------------

def _post_clip(pinned: bool) -> str:
    """A custom loop's print (loss to two decimals, the norm after `clip_grad_norm_(..., 1.0)` is re-measured):
    while the gradients are large the logged norm is exactly 1.0 and the slow first logs repeat their loss;
    later the norm falls under 1 and the loss falls. Or the norm is the sentinel, pinned, and the loss frozen."""
    lines = []
    for i in range(40):
        loss = 2.31 if i < 4 or pinned else 2.31 - 0.03 * (i - 3)
        grad = 1.0 if pinned else min(1.0, 3.0 * 0.95 ** i)
        lines.append(f"step {10 * (i + 1):4d} | loss {loss:.2f} | grad_norm {grad:.4f} | lr 1.00e-04\n")
    return "".join(lines)


def test_grad001_twin_a_norm_logged_after_clipping_to_1_reads_healthy(tmp_path):
    """Scripted (a custom loop's print): the norm sits at 1.0 for 23 logs, then falls under it; the loss falls."""
    d = _analyze(tmp_path, _post_clip(pinned=False))
    assert d.verdict == "healthy", (d.verdict, d.signature, _codes(d))
    assert _codes(d).get("GRAD001") == "info"  # the sentinel value is seen, and contradicted


def test_grad001_death_a_norm_pinned_at_1_beside_a_frozen_loss_is_broken(tmp_path):
    d = _analyze(tmp_path, _post_clip(pinned=True))
    assert (d.verdict, d.signature) == ("broken", "nonfinite-hidden"), _codes(d)


# -- LOSS009: a loss that repeats an earlier stretch ------------------------------------------------------------

def _launched_twice(learns: bool) -> str:
    """A plain loop's print (no step numbers), launched twice with the same seed into one file (`>> train.log`):
    the second launch replays the first value for value; an evaluation every ten logs."""
    lines = []
    for i in range(1, 41):
        lines.append(f"train loss: {(2.4 - 0.02 * i if learns else 2.4) + 0.15 * math.sin(1.7 * i) ** 2:.4f}")
        if i % 10 == 0:
            lines.append(f"eval loss: {2.5 - 0.01 * i if learns else 2.5:.4f}")
    return "\n".join(lines + lines) + "\n"


def test_loss009_twin_a_run_launched_twice_with_one_seed_whose_eval_improves_reads_healthy(tmp_path):
    """Scripted (a plain loop's print): the repeat is the log's; the evaluations change, so the weights move."""
    d = _analyze(tmp_path, _launched_twice(learns=True))
    assert d.verdict == "healthy" and _codes(d).get("LOSS009") == "info", (d.verdict, _codes(d))


def test_loss009_twin_real_a_loop_launched_twice_with_one_seed_reads_healthy():
    """Real: a plain PyTorch loop (no dropout, fixed batch order) launched twice into one file; the second
    launch replays the first digit for digit while its evaluation loss falls."""
    lines = (TWINS_DIR / "relaunched" / "train.log").read_text().splitlines()
    assert lines[: len(lines) // 2] == lines[len(lines) // 2:]  # the replay is real, not made up
    d = analyze([TWINS_DIR / "relaunched" / "train.log"])
    assert d.verdict == "healthy" and _codes(d).get("LOSS009") == "info", (d.verdict, _codes(d))


def test_loss009_death_real_frozen_weights_replay_their_epoch_and_their_evaluation():
    """Real: the same loop one epoch in, then the LR at 0 for two epochs."""
    d = analyze([TWINS_DIR / "frozen" / "train.log"])
    assert (d.verdict, d.signature) == ("broken", "not-learning") and _codes(d).get("LOSS009") == "error", _codes(d)


def test_loss009_death_frozen_weights_replay_the_epoch_and_the_evaluation_is_broken(tmp_path):
    d = _analyze(tmp_path, _launched_twice(learns=False))
    assert (d.verdict, d.signature) == ("broken", "not-learning") and _codes(d).get("LOSS009") == "error", _codes(d)


# -- LOSS008: a flat loss beside a tiny gradient norm ---------------------------------------------------------

def _flat_tiny_grad(first_epoch: float) -> str:
    """HF 4.x dicts (no step numbers): 24 logs of a loss flat at 0.41 with a gradient norm near 0.005 and a
    decaying LR, from `first_epoch`."""
    import random

    noise = random.Random(3)
    return _rows({"loss": round(0.412 + 0.003 * noise.uniform(-1, 1), 4),
                  "grad_norm": round(0.0051 + 0.0012 * noise.random(), 6),
                  "learning_rate": 2e-5 * (1 - (first_epoch * 100 + i) / (first_epoch * 100 + 26)),
                  "epoch": round(first_epoch + i / 100, 2)} for i in range(24))


def test_loss008_twin_the_pasted_tail_of_a_converged_run_reads_healthy(tmp_path):
    """Scripted (HF 4.x dicts): the last logs of a converged run, from epoch 2.76, LR decaying to its end;
    the log's own numbering places its first line at step 1."""
    d = _analyze(tmp_path, _flat_tiny_grad(2.76))
    assert d.verdict == "healthy" and _codes(d).get("LOSS008") == "info", (d.verdict, _codes(d))


def test_loss008_death_the_same_plateau_from_the_first_epoch_is_broken(tmp_path):
    d = _analyze(tmp_path, _flat_tiny_grad(0.01))
    assert (d.verdict, d.signature) == ("broken", "no-grad-flow"), _codes(d)


# -- the registry: a rule that can call a run broken lands with its table and its twin -------------------------

TWINS = {
    "GRAD002": test_grad002_twin_real_layerwise_optimizer_reads_healthy,
    "LR002": test_lr002_twin_schedule_end_with_a_loss_rounded_to_zero_is_memorization,
    "LR001": test_lr001_twin_an_lr_rounded_to_zero_by_its_print_while_the_loss_moves,
    "GRAD006": test_grad006_twin_one_grpo_record_with_equal_rewards_is_an_event,
    "LOSS010": test_loss010_twin_an_lm_plateau_at_ln_10_logged_mid_run_is_not_chance,
    "LOSS004": test_loss004_twin_a_dpo_loss_that_leaves_ln_2_reads_healthy,
    "LOSS005": test_loss005_twin_a_warmup_overshoot_that_comes_back_down_is_no_divergence,
    "LABEL001": test_label001_twin_a_memorised_model_whose_loss_and_norm_shrink_to_a_printed_zero,
    "LOSS003": test_loss003_twin_the_pasted_tail_of_a_memorised_run_is_a_warning,
    "LOSS001": test_loss001_loss002_scale001_twin_a_window_of_skipped_steps_then_training_is_a_warning,
    "LOSS002": test_loss001_loss002_scale001_twin_a_window_of_skipped_steps_then_training_is_a_warning,
    "SCALE001": test_scale001_twin_a_scale_that_recalibrates_after_a_burst_of_overflows_is_a_warning,
    "GRAD001": test_grad001_twin_a_norm_logged_after_clipping_to_1_reads_healthy,
    "LOSS009": test_loss009_twin_real_a_loop_launched_twice_with_one_seed_reads_healthy,
    "LOSS008": test_loss008_twin_the_pasted_tail_of_a_converged_run_reads_healthy,
}
# Rules that can call a run broken (by their signature) and have no twin, each with why: none can have one
# from a log alone. This only shrinks: a new rule must land with its `predicts` table and its twin.
NO_TWIN_YET = {
    "LOSS011": "never more than a warning: the finite loss column beside the NaN one is its own contradiction, "
               "and the death it could stand for is LOSS001's",
    "RANK001": "live only: the guard compares the ranks' weight fingerprints, which no log prints",
    "GRAD003": "a fact from the live guard (0 trainable parameters counted on the model), not a symptom of a log",
    "GRAD004": "a fact from the live guard (tensors that require grad and got none after backward)",
    "GRAD005": "a fact from the live guard (trainable tensors that are in no optimizer parameter group)",
}


def _broken_capable():
    return [d for d in make_detectors() if SIGNATURES.get(d.signature, ("",))[0] == "broken"]


def test_every_rule_that_can_call_a_run_broken_has_a_twin_and_a_table():
    codes = {d.code for d in _broken_capable()}
    assert codes, "no broken-capable rule found"
    missing = codes - set(TWINS) - set(NO_TWIN_YET)
    assert not missing, f"rules that can call a run broken without a healthy twin: {sorted(missing)}"
    assert not (set(NO_TWIN_YET) - codes), "NO_TWIN_YET names a rule that is gone or cannot call a run broken"
    assert not (set(NO_TWIN_YET) & set(TWINS)), "a rule with a twin must leave NO_TWIN_YET"
    assert all(isinstance(why, str) and why for why in NO_TWIN_YET.values())
    for detector in _broken_capable():
        if detector.code in TWINS:
            assert {"loss", "grad_norm", "lr"} & set(detector.predicts), detector.code
            assert all(isinstance(v, str) and v for v in detector.predicts.values()), detector.code
