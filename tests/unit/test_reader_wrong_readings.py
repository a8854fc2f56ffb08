"""Readings that were wrong (issue #25's list), each held by a test that failed before."""

import math

from lossguard.core.engine import Engine
from lossguard.core.records import EVAL, TRAIN, Record
from lossguard.detectors import make_detectors
from lossguard.diagnose.diagnosis import diagnose
from lossguard.sources.text_log import parse_lines


def _read(*lines: bytes):
    return [(r.kind, r.step, r.signals, r.event) for r in parse_lines(list(lines))]


def test_a_warnings_source_path_is_no_loss_even_when_a_folder_is_named_lossguard():
    assert _read(b"/home/u/lossguard/x/torch/distributed/c10d_logger.py:83: FutureWarning: x") == []
    assert _read(b"/srv/loss_scaler.cc:120: W warning") == []
    assert _read(b"train/loss: 2.3 step: 5") == [(TRAIN, 5, {"loss": 2.3}, None)]


def test_fairseq_0_12s_overflow_line_is_an_overflow():
    line = (b"2024-01-01 10:00:00 | INFO | fairseq.trainer | NOTE: gradient overflow detected, ignoring gradient, "
            b"setting loss scale to: 64.0")
    assert [event for kind, _, _, event in _read(line)] == ["overflow"]


def test_an_eval_metric_on_a_step_line_is_an_evaluation_record():
    assert _read(b"step 10 val/loss=2.5") == [(EVAL, 10, {"eval_loss": 2.5}, None)]
    assert _read(b"step 10 eval_loss=2.5") == [(EVAL, 10, {"eval_loss": 2.5}, None)]
    assert _read(b"step 10 loss=2.1 eval_loss=2.5") == [(EVAL, 10, {"eval_loss": 2.5}, None),
                                                        (TRAIN, 10, {"loss": 2.1}, None)]


def test_overfitting_is_checked_on_step_lines_with_eval_losses():
    lines = []
    for step in range(1, 41):
        lines.append(b"step %d loss=%.4f" % (step, 3.0 * math.exp(-step / 8) + 0.05))
        if step % 5 == 0:
            lines.append(b"step %d val/loss=%.4f" % (step, 2.0 + abs(step - 10) * 0.08))
    engine = Engine(make_detectors())
    engine.feed_all(list(parse_lines(lines)))
    diagnosis = diagnose(engine.finish())
    assert diagnosis.result.stats.num_eval == 8
    assert any(f.code == "EVAL001" for f in diagnosis.findings), [f.code for f in diagnosis.findings]


def test_a_zero_gradient_rl_step_with_only_frac_reward_zero_std_logged_is_reported():
    engine = Engine(make_detectors())
    engine.feed_all([Record(step=s, signals={"loss": 0.0, "grad_norm": 0.0, "reward": 0.5, "kl": 0.0,
                                             "frac_reward_zero_std": 1.0}) for s in range(1, 6)])
    diagnosis = diagnose(engine.finish())
    grad006 = [f for f in diagnosis.findings if f.code == "GRAD006"]
    assert grad006 and "frac_reward_zero_std 1" in grad006[0].message, [f.message for f in diagnosis.findings]
    assert diagnosis.verdict != "healthy"


def _diagnose(lines: list[bytes]):
    engine = Engine(make_detectors())
    engine.feed_all(list(parse_lines(lines)))
    return diagnose(engine.finish())


def test_lossguards_own_halt_lines_in_a_log_are_its_evidence():
    """A run the live guard halted at its first NaN logged nothing else of it: the log read HEALTHY."""
    head = [b"{'loss': 2.51, 'grad_norm': 1.2, 'learning_rate': 1e-05, 'epoch': 0.05}",
            b"{'loss': 2.49, 'grad_norm': 1.1, 'learning_rate': 1e-05, 'epoch': 0.10}"]
    guard = [b"[rank0]: lossguard: step 3: CRITICAL LOSS001 [nonfinite] loss is NaN at step 3",
             b"[rank0]: lossguard: halting at step 3 on every rank: LOSS001 (nonfinite)"]
    assert _diagnose(head).verdict == "healthy"
    diagnosis = _diagnose(head + guard)
    assert (diagnosis.verdict, diagnosis.signature) == ("broken", "nonfinite")
    (finding,) = [f for f in diagnosis.findings if f.code == "GUARD001"]
    assert finding.step == 3 and finding.data["reported_code"] == "LOSS001" and "LOSS001" in finding.message
    only_halt = _diagnose(head + guard[1:])
    assert only_halt.signature == "nonfinite"


def test_a_fairseq_json_log_counts_num_updates_as_its_step(tmp_path):
    """fairseq's JSON lines name the step `num_updates`: they were numbered 1, 2, 3 as ordinal logs."""
    from lossguard.sources import discover, records

    path = tmp_path / "train.jsonl"
    path.write_text("".join(f'{{"epoch": 1, "num_updates": {100 * n}, "loss": {3 - 0.1 * n:.2f}, "lr": 0.0005}}\n'
                            for n in range(1, 6)))
    got = [(r.step, r.step_is_ordinal) for r in records(discover([str(path)]))]
    assert got == [(100, False), (200, False), (300, False), (400, False), (500, False)]


def test_one_vocabulary_a_step_key_is_a_step_in_every_format(tmp_path):
    """`num_updates` / `global_step` name the step on a text line, in a log dict, a JSON row and a CSV header."""
    from lossguard.sources import discover, records

    assert _read(b"num_updates 300 | loss 2.5")[0][1] == 300
    assert _read(b"{'loss': 2.5, 'num_updates': 300}")[0][1] == 300
    (tmp_path / "m.csv").write_text("num_updates,loss\n300,2.5\n400,2.4\n")
    assert [r.step for r in records(discover([str(tmp_path / "m.csv")]))] == [300, 400]
