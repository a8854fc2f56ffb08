"""lint's batch resolution against DeepSpeed's own code: the same refusals, messages and derived values."""

from __future__ import annotations

import itertools

import pytest

from lossguard.lint.api import lint
from lossguard.lint.batchsize import check_batch, resolve_for_world

VALUES = (None, 1, 3, 4, 16, 30, 256)
GRID = [(t, m, g, w) for t, m, g in itertools.product(VALUES, VALUES, (None, 1, 2, 8)) for w in (1, 2, 4, 8)]


def deepspeed_verdict(total, micro, ga, world):
    """Run DeepSpeed's real `_configure_train_batch_size` on an object holding just the batch fields."""
    from deepspeed.runtime.config import DeepSpeedConfig

    obj = object.__new__(DeepSpeedConfig)
    obj.train_batch_size, obj.train_micro_batch_size_per_gpu = total, micro
    obj.gradient_accumulation_steps, obj.world_size = ga, world
    try:
        obj._configure_train_batch_size()
    except (AssertionError, ZeroDivisionError) as exc:
        return None, None, None, str(exc)
    return obj.train_batch_size, obj.train_micro_batch_size_per_gpu, obj.gradient_accumulation_steps, None


def test_resolution_matches_deepspeed_on_a_grid():
    pytest.importorskip("deepspeed")
    for total, micro, ga, world in GRID:
        expected = deepspeed_verdict(total, micro, ga, world)
        ours = resolve_for_world(total, micro, ga, world)
        if expected[3] is None:
            assert ours.refusal is None and (ours.total, ours.micro, ours.ga) == expected[:3], (total, micro, ga, world)
        else:
            assert ours.refusal == expected[3], (total, micro, ga, world, ours.refusal, expected[3])


def test_absent_gradient_accumulation_is_derived_not_one():
    assert check_batch(256, 4, None, 8).ga == 8 and check_batch(256, 4, None, 8).refusal is None
    assert check_batch(256, 4, None, None).refusal is None
    config = {"train_batch_size": 256, "train_micro_batch_size_per_gpu": 4}
    assert not [f for f in lint(config, {"world_size": 8}, env={}) if f.code == "DSC111"]


def test_refusal_quotes_deepspeed():
    findings = [f for f in lint({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4,
                                 "gradient_accumulation_steps": 2}, {"world_size": 4}, env={}) if f.code == "DSC111"]
    assert len(findings) == 1 and "64 != 4 * 2 * 4" in findings[0].message
    assert "refuses to start with 4 rank(s)" in findings[0].message
