"""fp16 loss-scale overflows in the middle of a run (SCALE001): a scaler probing upward overflows once and
halves back, which is healthy; the scale halving twice in a row after training had started means the
gradients outgrew a scale that fitted them (a warning: training goes on, the update is growing); skipped
steps whose own loss is non-finite are the forward pass overflowing, which no scale fixes (broken, at
start-up too: a calibration skip computes a finite forward loss)."""

from lossguard.api import analyze

OVERFLOW = "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: {a}, reducing to {b}"


def _dict(i, loss=None):
    loss = f"{2.5 * 0.98 ** i:.4f}" if loss is None else loss
    return f"{{'loss': {loss}, 'grad_norm': {1.0 + 0.01 * (i % 5):.4f}, 'learning_rate': 2e-05, 'epoch': {i / 100:.2f}}}"


def _run(tmp_path, lines):
    log = tmp_path / "train.log"
    log.write_text("\n".join(lines) + "\n")
    return analyze([str(log)]).to_dict()


def test_two_halvings_in_a_row_mid_run_are_a_warning(tmp_path):
    lines = [_dict(i) for i in range(1, 31)]
    lines += [OVERFLOW.format(a=128.0, b=64.0), OVERFLOW.format(a=64.0, b=32.0)]
    lines += [_dict(i) for i in range(33, 60)]
    result = _run(tmp_path, lines)
    assert (result["verdict"], result["signature"]) == ("warning", "fp16-overflow"), result["findings"]


def test_twin_a_scaler_probing_upward_overflows_once_at_a_time(tmp_path):
    lines = [_dict(i) for i in range(1, 31)]
    for start in (31, 61, 91):  # every 30 logs the scale doubles, overflows once and halves back
        lines += [OVERFLOW.format(a=256.0, b=128.0)] + [_dict(i) for i in range(start + 1, start + 30)]
    result = _run(tmp_path, lines)
    assert result["verdict"] == "healthy", result["findings"]


def test_skipped_steps_whose_own_loss_is_nan_are_a_forward_overflow_even_at_start_up(tmp_path):
    lines = []
    for i in range(1, 6):
        lines += [OVERFLOW.format(a=2.0 ** (33 - i), b=2.0 ** (32 - i)), _dict(i, loss="nan")]
    result = _run(tmp_path, lines)
    assert (result["verdict"], result["signature"]) == ("broken", "fp16-overflow"), result["findings"]
    # the twin: the same start-up calibration with finite forward losses, then training
    lines = []
    for i in range(1, 6):
        lines += [OVERFLOW.format(a=2.0 ** (33 - i), b=2.0 ** (32 - i)), _dict(i)]
    result = _run(tmp_path, lines + [_dict(i) for i in range(6, 40)])
    assert result["verdict"] in ("healthy", "warning") and result["signature"] != "fp16-overflow", result["findings"]
