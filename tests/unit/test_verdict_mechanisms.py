"""Verdicts from mechanisms (issue #23, item 4): each test states one mechanism on synthetic input, in the
shapes real tools print; where a real log of ../shared/reallogs shows it, that case is one example of it,
never the rule's source."""

from __future__ import annotations

import math

from lossguard.api import analyze
from lossguard.core.engine import Engine
from lossguard.core.records import EVAL, Record, event
from lossguard.detectors import make_detectors
from lossguard.diagnose.diagnosis import diagnose


def run(records):
    engine = Engine(make_detectors())
    engine.feed_all(records)
    return diagnose(engine.finish())


def _analyze(tmp_path, text: str, name: str = "train.log"):
    log = tmp_path / name
    log.write_text(text)
    return analyze([log])


def _mismatch(got: int, expected: int) -> str:
    return f"WARNING: tokenization mismatch: {got} vs. {expected}. #turn = 1. (ignored)\n"


# -- 1. one offset on every sample is the template ------------------------------------------------------

def test_mismatch_warnings_all_off_by_one_offset_are_a_template_cut_of_every_sample(tmp_path):
    """LLaVA/FastChat mask a whole sample when the template's count is off; a wrong template is off by the
    same tokens on every sample (LLaVA #1706: always +14), so every sample is masked: broken."""
    for offset in (14, -1, 4):
        text = "".join(_mismatch(n, n + offset) for n in (149, 187, 204, 210, 234))
        d = _analyze(tmp_path, text)
        assert (d.verdict, d.signature) == ("broken", "masked-labels"), offset
        assert f"{offset:+d}" in d.findings[0].message


def test_mismatch_warnings_with_varying_offsets_stay_a_warning(tmp_path):
    """Offsets that differ from sample to sample are samples cut for their own reasons (truncation, odd turns)."""
    text = "".join(_mismatch(n, n + off) for n, off in ((327, -1), (405, -11), (485, -3), (654, -11), (737, -5)))
    d = _analyze(tmp_path, text)
    assert (d.verdict, d.signature) == ("warning", "masked-labels")


def test_one_sample_or_its_copies_do_not_make_an_offset_constant(tmp_path):
    """One sample (printed again by a second rank) shows an offset, not a rule."""
    d = _analyze(tmp_path, _mismatch(234, 248) * 3)
    assert (d.verdict, d.signature) == ("warning", "masked-labels")


def test_a_constant_offset_beside_a_learning_loss_is_one_sources_template_so_a_warning(tmp_path):
    """A finite, non-zero loss says some samples still train (one data source's template is wrong)."""
    rows = "".join(repr({"loss": 2.0 - i / 20, "grad_norm": 1.1, "learning_rate": 1e-5, "epoch": i / 10}) + "\n"
                   for i in range(12))
    d = _analyze(tmp_path, _mismatch(52, 51) + _mismatch(57, 56) + rows + _mismatch(60, 59))
    assert (d.verdict, d.signature) == ("warning", "masked-labels")


# -- 3. a progress bar's N/M is the step; calibration starts at a high scale ------------------------------

def test_a_training_bar_on_a_line_gives_the_step_of_the_events_on_it_and_of_the_next_log():
    from lossguard.sources.text_log import parse_lines

    lines = [b" 14%|\xe2\x96\x88\xe2\x96\x8d     | 379/2724 [14:00:21<86:09:52, 132.28s/it][INFO] [deepspeed] OVERFLOW! "
             b"Rank 0 Skipping step. Attempted loss scale: 32, reducing to 16",
             b"{'loss': 2.0491, 'learning_rate': 0.0001961913563176343, 'epoch': 0.28}",
             b"  0%|  | 11/10000 [00:35<8:24:57,  3.03s/it]tried to get lr value before scheduler/optimizer "
             b"started stepping, returning lr=0",
             b"{'loss': 2.2785, 'grad_norm': 0.0, 'learning_rate': 0, 'epoch': 0.08}"]
    records = list(parse_lines(lines[:2]))
    assert [(r.event, r.step) for r in records] == [("overflow", 380), (None, 380)]
    assert not records[1].step_is_ordinal
    records = list(parse_lines(lines[2:]))
    assert [(r.event, r.step) for r in records] == [("lr-before-step", 12), (None, 11)]


def test_only_a_running_bar_without_a_description_is_the_training_step():
    from lossguard.sources.progress import bar_step

    assert bar_step(b" 14%|#4   | 379/2724 [14:00:21<86:09:52, 132.28s/it]OVERFLOW") == 379
    assert bar_step(b"[rank0]: 2024-05-01 10:00:00,123 - INFO -  14%|#4 | 379/2724 [14:00<86:09, 1s/it]") == 379
    assert bar_step(b"\r  1%|   | 2/182 [01:05<1:37:41]\r  2%|   | 3/182 [01:37<1:36:59, 32.51s/it]x") == 3
    assert bar_step(b"Map:  14%|#4   | 7000/52002 [00:01<00:07, 5000.0 examples/s]") is None  # a data pass
    assert bar_step(b"Epoch 0:   3%|3  | 565/20101 [2:12:19<76:15:08, 14.05s/it, loss=nan]") is None  # batches
    assert bar_step(b"100%|##########| 182/182 [01:37<00:00]") is None  # finished
    assert bar_step(b"loss 3/4 [x]") is None


def test_overflows_halving_a_scale_under_every_initial_scale_are_no_start_up_calibration(tmp_path):
    """DeepSpeed calibrates down from 2^16 (fairseq from 2^7, Megatron 2^32): skips in a row that halve 32 ->
    16 -> 8 -> 4 are a storm wherever the log starts (009 cut to its middle: 14% into the run)."""
    bar = " 14%|#4   | {n}/2724 [14:00:21<86:09:52, 132.28s/it]"
    ovf = "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: {a}, reducing to {b}\n"
    text = (bar.format(n=379) + ovf.format(a=32, b=16) +
            "{'loss': 2.0491, 'learning_rate': 0.0001961913563176343, 'epoch': 0.28}\n" +
            "".join(bar.format(n=n) + ovf.format(a=a, b=a // 2) for n, a in ((380, 16), (381, 8), (382, 4))))
    d = _analyze(tmp_path, text)
    assert (d.verdict, d.signature, d.onset_step) == ("broken", "fp16-overflow", 380)


def test_start_up_skips_down_from_a_high_initial_scale_stay_calibration():
    records = [event("overflow", step=s, attempted_scale=2.0 ** (17 - s), new_scale=2.0 ** (16 - s))
               for s in range(1, 5)]
    records += [Record(step=s, signals={"loss": 2.5 - s / 100, "lr": 1e-5 * s}) for s in range(5, 30)]
    d = run(records)
    assert d.verdict == "healthy"
    assert any("calibrated" in f.message for f in d.findings)


# -- 2. an LR of 0 at the first logs that later rises is warmup ----------------------------------------

def _lr_logs(lrs, start=1, grad=None, warned=False):
    out = []
    for i, lr in enumerate(lrs):
        if warned and lr == 0.0:
            out.append(event("lr-before-step", step=start + i))
        signals = {"loss": 2.9 - i / 50 + (i % 2) / 100, "lr": lr}
        if grad is not None:
            signals["grad_norm"] = grad
        out.append(Record(step=start + i, signals=signals))
    return out


def test_an_lr_of_zero_at_the_first_logs_that_then_rises_is_warmup_not_lr_zero():
    """DeepSpeed steps the scheduler only on applied steps: while the loss scale calibrates the Trainer logs
    LR 0 (and warns the scheduler has not stepped), then the warmup starts (BELLE #134)."""
    warmup = [0.0] * 4 + [2.35e-6, 2.35e-6, 3.7e-6, 4.7e-6, 5.5e-6, 6.1e-6]
    for warned in (False, True):
        d = run(_lr_logs(warmup, warned=warned))
        assert d.verdict == "healthy" and "LR001" not in {f.code for f in d.findings}, warned


def test_an_lr_of_zero_from_the_start_to_the_end_of_the_log_is_lr_zero():
    d = run(_lr_logs([0.0] * 4))
    assert (d.verdict, d.signature, d.onset_step) == ("broken", "lr-zero", 1)


def test_an_lr_of_zero_with_no_step_applied_for_longer_than_calibration_is_lr_zero():
    """One log at step 11 with LR 0, grad norm 0.0 and the 'scheduler not stepped' warning: 11 steps without an
    optimizer step, more than DeepSpeed's calibration from 2^16 takes (MiniCPM-V #346)."""
    from lossguard.detectors.overflow_lr import MAX_CALIBRATION_STEPS

    assert MAX_CALIBRATION_STEPS == 10  # 2^16 -> 2^7: 9 halvings, + 1 overflow the hysteresis of 2 absorbs
    late = MAX_CALIBRATION_STEPS + 1
    for warned, grad in ((True, None), (False, 0.0), (True, 0.0)):
        d = run(_lr_logs([0.0], start=late, grad=grad, warned=warned))
        assert (d.verdict, d.signature) == ("broken", "lr-zero"), (warned, grad)
    # Within the calibration it says nothing yet; without a sign that no step was applied (an LR printed as
    # 0.0000 beside a moving grad norm) a real step number alone proves nothing.
    assert run(_lr_logs([0.0], start=MAX_CALIBRATION_STEPS, grad=0.0, warned=True)).verdict == "healthy"
    assert run(_lr_logs([0.0, 0.0], start=late, grad=12.6)).verdict == "healthy"
    # A zero run after the LR had moved is judged at three logs, as before.
    d = run(_lr_logs([1e-5, 1e-5, 0.0, 0.0, 0.0, 1e-5]))
    assert (d.verdict, d.signature, d.onset_step) == ("broken", "lr-zero", 3)


# -- 4. a loss flat at ln(k) is a uniform guess --------------------------------------------------------

def _evals(values, start=50, every=50):
    return [Record(step=start + i * every, kind=EVAL, signals={"eval_loss": v}) for i, v in enumerate(values)]


def _trains(values, start=50, every=50):
    return [Record(step=start + i * every, signals={"loss": v, "lr": 1e-5 * (i + 1)}) for i, v in enumerate(values)]


def test_an_eval_loss_pinned_at_ln_k_from_the_first_evaluation_is_not_learning():
    """A 4-way multiple-choice model that guesses uniformly scores ln 4 = 1.3863 on every example (LRQA)."""
    for k in (3, 4, 5, 10):
        level = math.log(k)
        pinned = [level * (1 + d) for d in (0.0, -2e-4, 5e-4, -1e-4, 3e-4, 0.0, -4e-4, 1e-4, 2e-4, -3e-4)]
        noisy_train = [level + 0.03 * ((i * 7) % 5) / 5 for i in range(10)]
        d = run(_trains(noisy_train) + _evals(pinned))
        assert (d.verdict, d.signature, d.onset_step) == ("broken", "not-learning", 50), k


def test_a_train_loss_pinned_at_ln_k_is_not_learning_and_one_that_leaves_it_is_not():
    level = math.log(4)
    d = run(_trains([level * (1 + 1e-3 * math.sin(i)) for i in range(12)]))  # never the same value twice
    assert (d.verdict, d.signature) == ("broken", "not-learning")
    assert "LOSS010" in {f.code for f in d.findings}
    falling = [level * (1 + (i % 3 - 1) * 5e-4) for i in range(4)] + [1.2, 1.0, 0.9, 0.8]
    assert "LOSS010" not in {f.code for f in run(_trains(falling)).findings}


def test_near_misses_of_a_chance_level_loss():
    level = math.log(4)
    passing = [1.6, 1.5, 1.45, level, level, level, 1.3, 1.2]  # passes through ln 4 on its way down
    assert "LOSS010" not in {f.code for f in run(_evals(passing)).findings}
    assert "LOSS010" not in {f.code for f in run(_evals([level] * 4)).findings}  # too few to tell
    dpo = [Record(step=s, signals={"loss": math.log(2), "reward_margin": 0.0, "lr": 1e-6}) for s in range(1, 12)]
    assert "LOSS010" not in {f.code for f in run(dpo).findings}  # pairwise losses start at ln 2 by construction
    off_band = [level * 1.01] * 8  # 1% off: a flat loss, but no uniform guess
    assert "LOSS010" not in {f.code for f in run(_evals(off_band)).findings}


def test_an_eval_loss_at_chance_while_the_train_loss_falls_is_a_warning():
    level = math.log(4)
    d = run(_trains([2.0 * 0.8 ** i for i in range(12)]) + _evals([level] * 6))
    chance = next(f for f in d.findings if f.code == "LOSS010")
    assert str(chance.severity) == "warning"


# -- 5. a logged NaN is never dropped in favour of another loss column --------------------------------

def test_every_reader_keeps_a_nan_from_a_second_loss_column():
    from lossguard.sources.readers.generic import read_line
    from lossguard.sources.text_log import parse_lines

    bar = read_line(b"Epoch 0:   3%|3  | 565/20101 [2:12:19<76:15:08, 14.05s/it, loss=nan, reduced_train_loss=3.910, "
                    b"gradient_norm=1.010, global_step=564.0]")
    assert bar[0].signals["loss"] == 3.91 and math.isnan(bar[0].signals["other_loss"])
    for line in (b"{'loss': nan, 'lm_loss': 2.3, 'learning_rate': 1e-05}", b"{'lm_loss': 2.3, 'loss': nan}"):
        records = list(parse_lines([line] * 3))  # the third read goes through a learned layout, if any
        assert all(any(math.isnan(v) for v in r.signals.values()) for r in records), line


def test_a_nan_in_a_second_loss_column_is_at_least_a_warning_in_every_format(tmp_path):
    rows = [(i, 3.9 - i / 100) for i in range(1, 9)]
    texts = {
        "bar.log": "".join(f"Epoch 0:   3%|3  | {s}/20101 [2:12:19<76:15:08, 14.05s/it, loss=nan, "
                           f"reduced_train_loss={v:.3f}, gradient_norm=1.010, global_step={s}]\n" for s, v in rows),
        "dicts.log": "".join(repr({"loss": v, "lm_loss": float("nan"), "grad_norm": 1.2 + s / 50}) + "\n"
                           for s, v in rows),
        "metrics.jsonl": "".join(f'{{"step": {s}, "loss": NaN, "train_loss": {v}}}\n' for s, v in rows),
        "table.txt": "step  train_loss  loss\n" + "".join(f"{s}  {v}  nan\n" for s, v in rows),
    }
    for name, text in texts.items():
        d = _analyze(tmp_path, text, name)
        assert d.verdict in ("warning", "broken") and d.signature == "nonfinite", (name, d.verdict, d.signature)
