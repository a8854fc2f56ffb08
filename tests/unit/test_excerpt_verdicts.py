"""What users paste: excerpts of 1-40 metric lines. Each case is a mechanism, built here from scratch in
the shapes real tools print (HF Trainer dicts, DeepSpeed lines, TRL metric sets), never a copy of one thread's log.

A death that one line already proves needs no baseline, streak or warm-up; a rule that needs history must not call
an excerpt healthy for lack of it; and a value that looks dead but is legitimate (an RL loss of 0.0, a clipped
grad norm of exactly 1.0, lr 0 before the scheduler's first step) must not be called broken.
"""

from __future__ import annotations

from lossguard.api import analyze


def _run(tmp_path, text: str, name: str = "train.log"):
    log = tmp_path / name
    log.write_text(text)
    return analyze([log])


def _dicts(rows: list[dict]) -> str:
    return "".join(repr(row) + "\n" for row in rows)


# -- one line is enough -----------------------------------------------------------------------------------

def test_one_line_with_loss_and_lr_exactly_zero_is_dead(tmp_path):
    d = _run(tmp_path, _dicts([{"loss": 0.0, "learning_rate": 0, "epoch": 0.0}]))
    assert d.verdict == "broken" and d.signature == "lr-zero"


def test_one_line_with_loss_and_grad_norm_exactly_zero_is_masked_labels(tmp_path):
    d = _run(tmp_path, _dicts([{"loss": 0.0, "grad_norm": 0.0, "learning_rate": 9e-08, "epoch": 0.0}]))
    assert d.verdict == "broken" and d.signature == "masked-labels"


def test_mismatch_warnings_with_a_zero_loss_are_broken_not_a_warning(tmp_path):
    warnings = "".join(f"WARNING: tokenization mismatch: {n} vs. {n + 1}. #turn = 1. (ignored)\n"
                       for n in (69, 392, 1043, 281))
    d = _run(tmp_path, warnings + _dicts([{"loss": 0.0, "learning_rate": 9e-08, "epoch": 0.0}]))
    assert d.verdict == "broken" and d.signature == "masked-labels"
    assert "template" in (d.causes[0].id + d.causes[0].title).lower()


def test_scattered_mismatch_warnings_beside_a_learning_loss_stay_a_warning(tmp_path):
    rows = [{"loss": 2.0 - i / 20, "grad_norm": 1.1, "learning_rate": 1e-5, "epoch": i / 10} for i in range(12)]
    text = _dicts(rows[:6]) + "WARNING: tokenization mismatch: 512 vs. 509. (ignored)\n" + _dicts(rows[6:])
    d = _run(tmp_path, text)
    assert d.verdict == "warning" and d.signature == "masked-labels"


def test_loss_dropping_from_normal_to_exact_zero_in_one_log_is_broken(tmp_path):
    d = _run(tmp_path, _dicts([{"loss": 1.9166, "learning_rate": 2e-08, "epoch": 0.0},
                               {"loss": 0.0, "learning_rate": 4e-08, "epoch": 0.0},
                               {"loss": 0.0, "learning_rate": 6e-08, "epoch": 0.0}]))
    assert d.verdict == "broken" and d.signature in ("zero-loss", "nonfinite-hidden", "masked-labels")
    assert d.onset_step is not None


def test_zero_loss_with_a_frozen_learning_rate_is_a_skipped_step_death(tmp_path):
    # HF AMP / DeepSpeed skip the optimizer (and the scheduler) on non-finite gradients: the LR stops moving
    # at the very log where the loss turns into the NaN filter's 0.0.
    text = ('{"current_steps": 4440, "total_steps": 9750, "loss": 2.7044, "learning_rate": 2.966079263041303e-05}\n'
            '{"current_steps": 4450, "total_steps": 9750, "loss": 0.0, "learning_rate": 2.966079263041303e-05}\n')
    d = _run(tmp_path, text, "trainer_log.jsonl")
    assert d.verdict == "broken" and d.onset_step == 4450


# -- non-finite grad norms ---------------------------------------------------------------------------------

def test_grad_norm_nan_in_every_log_of_a_bf16_style_run_is_broken(tmp_path):
    # The LR schedule keeps moving (a skipped step would hold it): the steps are applied, with NaN gradients.
    rows = [{"loss": 7.14 + (i % 3) / 1000, "grad_norm": float("nan"), "learning_rate": 2.77e-5 - i * 1e-7,
             "epoch": i / 10} for i in range(8)]
    d = _run(tmp_path, _dicts(rows))
    assert d.verdict == "broken" and d.signature in ("nonfinite", "not-learning")


def test_one_isolated_nan_grad_norm_with_overflow_lines_is_a_skipped_fp16_step(tmp_path):
    rows = [{"loss": 2.0 - i / 40, "grad_norm": 1.2, "learning_rate": 1e-5 * (i + 1), "epoch": i / 10}
            for i in range(10)]
    rows[4]["grad_norm"] = float("nan")
    overflow = ("[2024-01-01 00:00:00,000] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] OVERFLOW! "
                "Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768\n")
    d = _run(tmp_path, _dicts(rows[:4]) + overflow + _dicts(rows[4:]))
    assert d.verdict != "broken"


def test_a_loss_that_jumps_by_orders_of_magnitude_with_a_nan_norm_is_broken(tmp_path):
    d = _run(tmp_path, _dicts([{"loss": 14.2, "grad_norm": 3.1, "learning_rate": 1e-4, "epoch": 0.1},
                               {"loss": 8195.3, "grad_norm": float("nan"), "learning_rate": 1e-4, "epoch": 0.2}]))
    assert d.verdict == "broken" and d.signature in ("nonfinite", "divergence")


def test_a_grad_norm_of_exactly_one_next_to_a_learning_loss_is_clipping_not_a_sentinel(tmp_path):
    rows = [{"loss": round(2.49 - i * 0.01, 4), "grad_norm": 1.0, "learning_rate": 1e-5, "epoch": i / 30}
            for i in range(30)]
    d = _run(tmp_path, _dicts(rows))
    assert d.verdict == "healthy", d.summary if hasattr(d, "summary") else d.verdict


def test_a_log_holding_a_non_finite_value_is_never_healthy(tmp_path):
    rows = [{"loss": 2.0 - i / 40, "grad_norm": 1.2, "learning_rate": 1e-5, "epoch": i / 10} for i in range(10)]
    rows.append({"eval_loss": float("nan"), "epoch": 1.0})
    d = _run(tmp_path, _dicts(rows))
    assert d.verdict in ("warning", "broken")


def test_grad_norm_nan_in_every_log_under_a_constant_lr_is_broken(tmp_path):
    # A constant schedule repeats its LR whether or not steps are skipped: it is no sign of skipping, and
    # the log shows none (no OVERFLOW line, no loss scale), so three NaN norms in a row are a death.
    rows = [{"loss": 2.31 - i / 100, "grad_norm": float("nan"), "learning_rate": 1e-5, "epoch": i / 10}
            for i in range(4)]
    d = _run(tmp_path, _dicts(rows))
    assert d.verdict == "broken" and d.signature == "nonfinite"


def test_one_nan_grad_norm_without_skipping_in_the_log_is_a_warning_not_healthy(tmp_path):
    rows = [{"loss": 2.0 - i / 40, "grad_norm": 1.2, "learning_rate": 1e-5 * (i + 1), "epoch": i / 10}
            for i in range(10)]
    rows[4]["grad_norm"] = float("nan")
    d = _run(tmp_path, _dicts(rows))
    assert d.verdict == "warning" and "LOSS001" in [f.code for f in d.findings]


# -- legitimate zeros ----------------------------------------------------------------------------------------

def test_an_rl_loss_of_zero_with_a_live_gradient_is_healthy(tmp_path):
    rows = [{"loss": 0.0, "grad_norm": g, "learning_rate": lr, "reward": r, "reward_std": 0.8, "kl": k,
             "epoch": e} for g, lr, r, k, e in ((1.67, 1.07e-06, 1.28, 0.0004, 0.04),
                                                 (0.98, 2.14e-06, 1.26, 0.0010, 0.07))]
    d = _run(tmp_path, _dicts(rows))
    assert d.verdict == "healthy"


def test_an_rl_step_with_zero_loss_and_zero_gradient_is_no_update(tmp_path):
    row = {"loss": 0.0, "grad_norm": 0.0, "learning_rate": 1.7e-06, "reward": 3.0, "reward_std": 0.0,
           "frac_reward_zero_std": 1.0, "epoch": 0.33}
    d = _run(tmp_path, _dicts([row]))
    assert d.verdict in ("broken", "warning") and d.signature in ("no-grad-flow", "not-learning", "zero-loss")
    assert d.signature != "masked-labels"


def test_lr_zero_before_the_scheduler_steps_then_warmup_is_healthy(tmp_path):
    warn = ("[WARNING|trainer_pt_utils.py:849] >> tried to get lr value before scheduler/optimizer started "
            "stepping, returning lr=0\n")
    rows = [{"loss": 2.3 - i / 50, "grad_norm": 1.4, "learning_rate": 0 if i < 2 else 1e-6 * (i - 1),
             "epoch": i / 10} for i in range(10)]
    d = _run(tmp_path, warn + _dicts(rows[:1]) + warn + _dicts(rows[1:]))
    assert d.verdict == "healthy"


def test_lr_zero_that_stays_is_broken(tmp_path):
    rows = [{"loss": 10.9, "learning_rate": 0.0, "epoch": i / 10} for i in range(6)]
    d = _run(tmp_path, _dicts(rows))
    assert d.verdict == "broken" and d.signature in ("lr-zero", "not-learning")


# -- other shapes of death -------------------------------------------------------------------------------------

def test_a_loss_sequence_repeating_from_one_epoch_to_the_next_is_not_learning(tmp_path):
    epoch = [2.31, 2.05, 2.44, 1.98, 2.12, 2.27]
    rows = [{"loss": v, "learning_rate": 1e-5, "epoch": e + i / 6} for e in range(3) for i, v in enumerate(epoch)]
    d = _run(tmp_path, _dicts(rows))
    assert d.verdict == "broken" and d.signature == "not-learning"


def test_eval_loss_climbing_far_above_its_best_while_train_falls_is_overfitting(tmp_path):
    text = ""
    for step in range(1, 21):
        text += repr({"loss": round(2.0 * 0.8 ** step, 5), "learning_rate": 1e-4, "epoch": step / 2}) + "\n"
        if step % 4 == 0:
            text += repr({"eval_loss": [1.9, 1.6, 2.4, 3.8, 5.5][step // 4 - 1], "epoch": step / 2}) + "\n"
    d = _run(tmp_path, text)
    assert d.verdict == "warning"
    overfit = [f for f in d.findings if "overfit" in f.message.lower()]
    assert overfit and "best" in overfit[0].message.lower()


def test_train_loss_to_near_zero_without_eval_stays_healthy(tmp_path):
    rows = [{"loss": round(2.0 * 0.6 ** i, 6), "grad_norm": 0.5 + i / 100, "learning_rate": 1e-4, "epoch": i}
            for i in range(20)]
    d = _run(tmp_path, _dicts(rows))
    assert d.verdict == "healthy"


def test_train_rows_carrying_a_null_eval_loss_are_train_rows(tmp_path):
    # LLaMA-Factory's trainer_log.jsonl writes "eval_loss": null on every training row.
    rows = [{"current_steps": s, "total_steps": 100, "loss": 2.7 - s / 100, "eval_loss": None,
             "learning_rate": 3e-5, "epoch": s / 10} for s in range(1, 5)]
    rows.append({"current_steps": 5, "total_steps": 100, "loss": 0.0, "eval_loss": None, "learning_rate": 3e-5,
                 "epoch": 0.5})
    import json
    d = _run(tmp_path, "".join(json.dumps(r) + "\n" for r in rows), "trainer_log.jsonl")
    assert d.result.stats.num_train == 5 and d.verdict == "broken"
    d = _run(tmp_path, "".join(repr(r) + "\n" for r in rows), "train.log")
    assert d.result.stats.num_train == 5 and d.verdict == "broken"


# -- loss-scaler lines of other optimizers ---------------------------------------------------------------------

def test_old_deepspeed_fused_optimizer_stuck_at_scale_one_is_an_overflow_storm(tmp_path):
    lines = ["[INFO] [fused_optimizer.py:314:_update_scale] \nGrad overflow on iteration 8\n",
             "[INFO] [fused_optimizer.py:316:_update_scale] Reducing dynamic loss scale from 1 to 1\n",
             "[INFO] [logging.py:60:log_dist] [Rank 0] Overflow detected. Skipping step. Attempted loss scale: 1, "
             "reducing to 1\n"]
    d = _run(tmp_path, "".join(lines * 3))
    assert d.verdict == "broken" and d.signature == "fp16-overflow"


def test_fairseq_overflow_notes_carry_the_new_scale(tmp_path):
    from lossguard.sources import discover, records

    log = tmp_path / "train.log"
    log.write_text("2020-03-23 11:41:18 | INFO | fairseq.trainer | NOTE: overflow detected, setting loss scale to: "
                   "0.00048828125\n2020-03-23 11:50:00 | INFO | fairseq.trainer | Minimum loss scale reached (0.0001)."
                   " Your loss is probably exploding.\n")
    events = [(r.event, r.data.get("new_scale")) for r in records(discover([str(log)])) if r.event]
    assert events == [("overflow", 0.00048828125), ("scale-at-minimum", None)]
