import math

from lossguard.core.engine import Engine
from lossguard.core.records import EVAL, Record, event
from lossguard.detectors import make_detectors
from lossguard.detectors._base import sentinel_index
from lossguard.diagnose.diagnosis import diagnose


def run(records):
    engine = Engine(make_detectors())
    engine.feed_all(records)
    return diagnose(engine.finish())


def logs(*rows, start=1):
    """rows of (loss, grad_norm, lr) -> HF-style train records at steps start, start+1, ..."""
    out = []
    for i, (loss, grad, lr) in enumerate(rows):
        signals = {"loss": loss, "lr": lr}
        if grad is not None:
            signals["grad_norm"] = grad
        out.append(Record(step=start + i, signals=signals))
    return out


def test_sentinels_in_float64_float32_and_printed_forms():
    assert sentinel_index(1.4142135623730951) == 2
    assert sentinel_index(1.4142135381698608) == 2
    assert sentinel_index(1.414) == 2  # transformers 5 prints 4 significant digits
    assert sentinel_index(1.7320508075688772) == 3
    assert sentinel_index(1.0) == 1
    assert sentinel_index(1.4142) == 2
    assert sentinel_index(1.4152) is None
    assert sentinel_index(0.9681) is None and sentinel_index(math.nan) is None


def test_a_value_is_a_sentinel_when_some_root_lies_within_its_printed_tolerance():
    """`sentinel_index` looks only at the root nearest the value's square; held to trying every root, over
    every value printed with one to four decimals and random full-precision floats near the roots."""
    import random

    from lossguard.detectors._base import SENTINELS, printed_tolerance

    def every_root(value):
        if not 0 < value < 3.0:
            return None
        return next((k for k, root in enumerate(SENTINELS, 1) if abs(value - root) <= printed_tolerance(value)), None)

    rng = random.Random(2)
    values = [round(i / 10 ** d, d) for d in range(1, 5) for i in range(0, 3 * 10 ** d + 1)]
    values += [root + rng.uniform(-0.06, 0.06) for root in SENTINELS for _ in range(2000)]
    values += [math.sqrt(k) * (1 + e) for k in range(1, 10) for e in (0.0, 1e-7, -1e-7, 3e-7)]
    found = [sentinel_index(v) for v in values]
    assert found == [every_root(v) for v in values]
    assert sum(k is not None for k in found) > 40


def test_a_finding_counts_every_log_that_shows_it_after_it_fired():
    """Once fired, a detector counts each later occurrence without a new finding (`again`): the finding's
    `occurrences` is every log that showed the fault, on the batch path and record by record."""
    rows = [(2.3, 1.8, 1e-5), (2.1, 1.6, 1e-5), (2.0, 1.5, 1e-5)] + [(0.0, math.nan, 1e-5)] * 7
    batch = {f.code: f for f in run(logs(*rows)).findings}
    engine = Engine(make_detectors())
    for record in logs(*rows):
        engine.feed(record)
    single = {f.code: f for f in diagnose(engine.finish()).findings}
    assert batch["LOSS002"].step == 4 and batch["LOSS002"].data["occurrences"] == 7
    assert single["LOSS002"].data["occurrences"] == 7
    assert batch["LOSS001"].data["occurrences"] == single["LOSS001"].data["occurrences"] == 7


def test_nan_filter_zero_after_normal_loss_with_sentinel_is_nonfinite_hidden():
    d = run(logs((2.3, 1.8, 1e-5), (2.1, 1.6, 1e-5), (4.0, 1.4142135623730951, 1e-5),
                 (0.0, 1.4142135623730951, 1e-5), (0.0, 1.4142135623730951, 1e-5)))
    assert (d.verdict, d.signature, d.onset_step) == ("broken", "nonfinite-hidden", 3)


def test_zeros_alone_confirm_the_filter_after_three_logs():
    d = run(logs((2.3, None, 1e-5), (2.2, None, 1e-5), (0.0, None, 1e-5), (0.0, None, 1e-5), (0.0, None, 1e-5)))
    assert (d.signature, d.onset_step) == ("nonfinite-hidden", 3)
    # Two zeros do not prove the filter artefact, but no loss falls from 2.2 to exactly 0 by learning: dead,
    # reported as the bare zero-loss with what would tell the kind (never "healthy").
    d = run(logs((2.3, None, 1e-5), (2.2, None, 1e-5), (0.0, None, 1e-5), (0.0, None, 1e-5)))
    assert (d.verdict, d.signature, d.onset_step) == ("broken", "zero-loss", 3)


def test_eval_nan_confirms_hidden_nan():
    records = logs((2.3, None, 1e-5), (2.2, None, 1e-5), (0.0, None, 1e-5))
    records.append(Record(step=3, kind=EVAL, signals={"eval_loss": math.nan}))
    d = run(records)
    assert (d.signature, d.onset_step) == ("nonfinite-hidden", 3)


def test_nan_shown_in_log_is_nonfinite():
    d = run(logs((2.3, 1.0, 1e-5), (math.nan, math.nan, 1e-5)))
    assert (d.signature, d.onset_step) == ("nonfinite", 2)


def test_masked_labels_loss_and_grad_zero_from_the_start():
    d = run(logs((0.0, 0.0, 0.0), (0.0, 0.0, 1e-4), (0.0, 0.0, 2e-4)))
    assert (d.verdict, d.signature, d.onset_step) == ("broken", "masked-labels", 1)


def test_masked_labels_live_one_rank_without_tokens():
    records = [Record(step=5, rank=0, signals={"raw_loss": 2.0, "num_label_tokens": 120.0}),
               Record(step=5, rank=1, signals={"raw_loss": 0.0, "num_label_tokens": 0.0})]
    d = run(records)
    assert (d.signature, d.onset_step) == ("masked-labels", 5)
    assert d.findings[0].rank == 1


def test_no_grad_flow_with_normal_loss():
    d = run(logs((2.08, 0.0, 2e-4), (2.079, 0.0, 2e-4), (2.083, 0.0, 2e-4)))
    assert (d.signature, d.onset_step) == ("no-grad-flow", 1)


def test_fp16_startup_calibration_is_benign():
    records = [event("overflow", step=i, attempted_scale=2.0 ** (32 - i), new_scale=2.0 ** (31 - i))
               for i in range(1, 12)]
    records += logs(*[(3.0 - 0.05 * i, 1.0 + 0.01 * i, 1e-4) for i in range(20)], start=12)
    d = run(records)
    assert d.verdict == "healthy"
    assert any(f.code == "SCALE001" and str(f.severity) == "info" for f in d.findings)


def test_fp16_storm_after_training_started():
    records = logs((3.0, 1.2, 1e-4), (2.9, 1.1, 1e-4))
    for step in range(3, 9):
        records.append(event("overflow", step=step, attempted_scale=2.0 ** (20 - step), new_scale=2.0 ** (19 - step)))
        records.append(Record(step=step, signals={"loss": 0.0, "grad_norm": math.inf, "lr": 1e-4}))
    d = run(records)
    assert (d.signature, d.onset_step) == ("fp16-overflow", 3)


def test_lr_zero_beyond_the_first_log():
    d = run(logs((2.0, 1.3, 0.0), (2.0, 1.2, 0.0), (2.0, 1.25, 0.0), (2.0, 1.3, 0.0)))
    assert (d.signature, d.onset_step) == ("lr-zero", 1)
    assert run(logs((2.0, 1.3, 0.0), (1.9, 1.2, 1e-4), (1.8, 1.1, 1e-4))).verdict == "healthy"


def test_lr_zero_run_ends_at_a_nonzero_lr_and_skips_skipped_steps():
    """LR001 is handed only zero-LR logs: a non-zero LR between them (a log it never sees) still ends the
    run, fed one by one or in a batch; a zero-LR log whose step was skipped neither counts nor ends it."""
    broken = logs((2.0, 1.3, 0.0), (2.0, 1.2, 0.0), (2.0, 1.2, 1e-4), (2.0, 1.25, 0.0), (2.0, 1.3, 0.0))
    assert run(broken).signature != "lr-zero"
    engine = Engine(make_detectors())
    for record in broken:
        engine.feed(record)
    assert "LR001" not in {f.code for f in engine.finish().findings}
    skipped = logs((2.0, 1.3, 0.0), (2.0, math.inf, 0.0), (2.0, 1.2, 0.0), (2.0, 1.25, 0.0))
    d = run(skipped)
    assert (d.signature, d.onset_step) == ("lr-zero", 1)
    lr001 = next(f for f in d.findings if f.code == "LR001")
    assert lr001.data.get("occurrences", 1) == 1  # reached 3 at step 4 only: the skipped step 2 not counted


def test_flat_loss_is_not_learning():
    d = run(logs(*[(2.9, 1.3 + 0.01 * i, 1e-4) for i in range(10)]))
    assert (d.signature, d.onset_step) == ("not-learning", 1)


def test_divergence_and_spike():
    rising = [(2.0, 1.2, 1e-3)] * 3 + [(2.0 + 3 * i, 10.0, 1e-3) for i in range(1, 8)]
    assert run(logs(*rising)).signature == "divergence"
    spike = [(2.0 - 0.01 * i, 1.2, 1e-4) for i in range(10)] + [(9.0, 30.0, 1e-4)] + \
            [(1.9 - 0.01 * i, 1.2, 1e-4) for i in range(5)]
    d = run(logs(*spike))
    assert (d.verdict, d.signature, d.onset_step) == ("warning", "loss-spike", 11)


def test_the_stand_in_loss_of_a_skipped_step_is_not_the_runs_minimum():
    """bf16 with check_grad_overflow: the one bad step is skipped (grad_norm inf) and the Trainer's NaN
    filter logs a stand-in loss well under the others (4.2 ... 1.8 ... 4.0). The loss after it is not a
    divergence from 1.8: the run goes on learning as before."""
    rows = [(4.2 - 0.03 * i, 2.0, 1e-3) for i in range(7)] + [(1.8, math.inf, 1e-3)] + \
           [(3.99 - 0.01 * i, 1.5, 1e-3) for i in range(12)]
    d = run(logs(*rows))
    assert "LOSS005" not in [f.code for f in d.findings], d.findings


def test_memorization_is_healthy_and_named():
    rows = [(3.0 * 0.6 ** i, 0.5 * 0.8 ** i + 0.01 * (i % 3), 1e-4) for i in range(30)]
    d = run(logs(*rows))
    assert d.verdict == "healthy" and d.signature == "memorization"


def test_rank_desync_from_fingerprints():
    records = [Record(step=10, rank=0, signals={"param_fingerprint": 123.456}),
               Record(step=10, rank=1, signals={"param_fingerprint": 123.456}),
               Record(step=20, rank=0, signals={"param_fingerprint": 130.0}),
               Record(step=20, rank=1, signals={"param_fingerprint": 131.5})]
    d = run(records)
    assert (d.signature, d.onset_step) == ("rank-desync", 20)


def test_zero_loss_when_nothing_else_tells():
    d = run(logs((0.0, None, 1e-4), (0.0, None, 1e-4), (0.0, None, 1e-4)))
    assert d.signature == "zero-loss"


def test_any_sentinel_prefilter_agrees_with_sentinel_index_everywhere():
    from lossguard.detectors._base import any_sentinel

    grid = [i / 10_000 for i in range(0, 31_000)] + [round(math.sqrt(k), d) for k in range(1, 9) for d in range(1, 9)]
    grid += [math.sqrt(k) for k in range(1, 9)] + [math.nan, math.inf, -math.inf, -1.0, 1e300]
    assert sum(1 for v in grid if sentinel_index(v)) > 80
    for value in grid:
        assert any_sentinel([value]) == bool(sentinel_index(value)), value


def test_a_few_label_masking_warnings_are_a_warning_and_never_hide_a_later_death():
    warnings = [event("tokenization-mismatch", step=s, got=5, expected=9) for s in (2, 30)]
    healthy = logs(*[(2.0 - i / 100, 1.0 + i / 1000, 1e-5) for i in range(40)])
    d = run(healthy[:10] + warnings[:1] + healthy[10:] + warnings[1:])
    assert (d.verdict, d.signature, d.onset_step) == ("warning", "masked-labels", 2)
    dead = logs(*[(0.0, math.nan, 1e-5)] * 5, start=41)
    d = run(healthy[:10] + warnings[:1] + healthy[10:] + warnings[1:] + dead)
    assert (d.verdict, d.signature, d.onset_step) == ("broken", "nonfinite-hidden", 41)


def test_intermittent_fp16_skips_while_training_proceeds_are_not_a_storm():
    """A PPO run: the scale goes 32 -> 16 -> 8, an OVERFLOW line every other iteration, losses still moving."""
    records, scale = [], 32.0
    for step in range(1, 41):
        if step % 2 == 0:
            scale = max(8.0, scale / 2)
            records.append(event("overflow", step=step, attempted_scale=scale * 2, new_scale=scale))
        records.append(Record(step=step, signals={"loss": 1.5 - 0.02 * step + 0.05 * (step % 3), "lr": 1e-5}))
    d = run(records)
    assert d.verdict in ("healthy", "warning")
    storm = [f for f in d.findings if f.code == "SCALE001"]
    assert storm and all(str(f.severity) == "info" for f in storm)


def test_fp16_scale_driven_to_a_fraction_is_a_storm():
    """fairseq's scales go below 1: a scale of 0.0005 reached between applied steps is a storm all the same."""
    records = logs((3.0, 1.2, 1e-4), (2.9, 1.1, 1e-4))
    for step, scale in zip((3, 5, 7), (4.0, 2.0, 0.0005)):
        records.append(event("overflow", step=step, attempted_scale=scale * 2, new_scale=scale))
        records += logs((2.9 - 0.01 * step, 1.0, 1e-4), (2.85 - 0.01 * step, 1.0, 1e-4), start=step)
    d = run(records)
    assert d.signature == "fp16-overflow"
    assert any(f.code == "SCALE001" and "driven down to 0.0005" in f.message for f in d.findings)
