"""The names tools give the grad norm, the LR and the step, read as the catalog's signals (core/signals.py,
sources/readers/generic.py), and the frozen-LR rule's wording and scope."""

import pytest

from lossguard.api import analyze
from lossguard.core.signals import canonical
from lossguard.sources.readers.generic import read_line


@pytest.mark.parametrize("key, name", [
    ("optim/total_grad_norm", "grad_norm"),  # OLMo
    ("actor/grad_norm", "grad_norm"),  # verl
    ("total_grad_norm", "grad_norm"),
    ("grad_norm/total", "grad_norm"),
    ("actor/lr", "lr"),  # verl
    ("lr-AdamW", "lr"),  # Lightning's LearningRateMonitor
    ("lr-DecoupledAdamW/group0", "lr"),  # Composer
    ("optim/learning_rate_group0", "lr"),
    ("lr-AdamW/pg1", "lr"),
])
def test_other_names_of_the_grad_norm_and_the_lr(key, name):
    assert canonical(key) == name


@pytest.mark.parametrize("key", ["grad_norm/layer.3.weight", "lr-AdamW/pg2", "min_lr", "lr_scale",
                                 "learning_rate_group1", "grad_norm_ratio", "clr", "lr-decay", "lr-warmup",
                                 "lr-min", "max_grad_norm", "lr_decay_iters"])
def test_a_layer_norm_or_another_groups_lr_is_not_the_runs(key):
    assert canonical(key) is None


def test_two_word_step_names():
    (segment,) = read_line(b"completed step: 6, seconds: 1.234, loss: 2.310")
    assert segment.step == 6 and segment.signals == {"loss": 2.31}
    (segment,) = read_line(b"validate step: 10  loss:  5.2184")
    assert segment.step == 10 and segment.is_eval
    # A total is no step.
    assert all(s.step is None for s in read_line(b"Total training steps: 1000, loss: 2.1"))


def test_a_header_line_names_the_step_of_the_lines_under_it():
    (segment,) = read_line(b"2024-02-01 10:00:01.000\tnode0:0\tolmo.train:1231\tINFO\t[step=7/739328,epoch=0]")
    assert segment.resolved_step() == 7 and set(segment.signals) <= {"epoch"}
    (segment,) = read_line(b"[batch=5/4800]:")
    assert segment.resolved_step() == 5
    assert read_line(b"Loading checkpoint shards: 3/3") == []  # a bare counter on its own is no step
    assert read_line(b"batch: 8") == []  # nor is a bare `batch` value


def _write(tmp_path, lrs, losses):
    path = tmp_path / "train.log"
    path.write_text("".join(f"{{'loss': {loss}, 'grad_norm': 1.2, 'learning_rate': {lr}, 'epoch': {i / 100}}}\n"
                            for i, (lr, loss) in enumerate(zip(lrs, losses), 1)))
    return path


def test_a_frozen_lr_says_what_the_log_shows(tmp_path):
    lrs = [1e-5, 1.1e-5, 1.2e-5] + [1.2e-5] * 6
    losses = [2.3, 2.2, 2.1] + [0.0] * 6
    found = {f.code: f for f in analyze([_write(tmp_path, lrs, losses)]).findings}
    assert "SCALE001" in found
    assert "None" not in found["SCALE001"].message and "the loss is exactly 0.0" in found["SCALE001"].message


def test_an_lr_that_drops_to_zero_was_zeroed_not_frozen(tmp_path):
    lrs = [1e-5, 1.1e-5, 1.2e-5] + [0.0] * 6
    losses = [2.3, 2.2, 2.1] + [0.0] * 6
    codes = {f.code for f in analyze([_write(tmp_path, lrs, losses)]).findings}
    assert "SCALE001" not in codes and "LR002" in codes
