"""The live guard's per-rank vector: what one rank encodes, every rank decodes back, slot for slot."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from lossguard.monitor import wire  # noqa: E402

CPU = torch.device("cpu")
LAYOUT = wire.Layout(num_lr=2, groups=("attn", "mlp", "lm_head"))


def roundtrip(values: wire.StepValues) -> tuple[dict, dict]:
    vector = LAYOUT.encode(values, CPU)
    assert vector.dtype == torch.float64 and vector.shape == (LAYOUT.length,)
    return LAYOUT.decode(vector.tolist())


def test_every_signal_comes_back_from_device_tensors_and_floats():
    values = wire.StepValues(
        raw_loss=torch.tensor(2.5, dtype=torch.float64), num_label_tokens=torch.tensor(96),
        min_label_tokens=torch.tensor(40), grad_norm=torch.tensor(0.75), loss_scale=65536.0, skipped_steps=3,
        param_fingerprint=123456.789, lrs=[1e-4, 2e-5, 9.0], update_ratios=[1e-3, math.nan, 2e-3])
    signals, data = roundtrip(values)
    assert signals == {"raw_loss": 2.5, "loss": 2.5, "num_label_tokens": 96.0, "min_label_tokens": 40.0,
                       "grad_norm": 0.75, "loss_scale": 65536.0, "skipped_steps": 3.0, "lr": 1e-4,
                       "param_fingerprint": 123456.789, "update_ratio": 2e-3}
    assert data["lr_groups"] == [1e-4, 2e-5]  # only as many learning rates as the layout has slots for
    assert data["update_ratio_groups"]["attn"] == 1e-3 and data["update_ratio_groups"]["lm_head"] == 2e-3
    assert math.isnan(data["update_ratio_groups"]["mlp"])


def test_absent_signals_stay_absent_and_non_finite_values_survive():
    signals, data = roundtrip(wire.StepValues(raw_loss=torch.tensor(math.inf), grad_norm=math.nan))
    assert set(signals) == {"raw_loss", "loss", "grad_norm"} and data == {}
    assert math.isinf(signals["loss"]) and math.isnan(signals["grad_norm"])
    assert roundtrip(wire.StepValues()) == ({}, {})


def test_all_update_ratios_nan_reads_as_nan_not_missing():
    signals, data = roundtrip(wire.StepValues(update_ratios=[math.nan] * 3))
    assert math.isnan(signals["update_ratio"]) and len(data["update_ratio_groups"]) == 3


def test_error_vector_is_the_only_failed_row():
    assert wire.failed(LAYOUT.error_vector(CPU).tolist())
    assert not wire.failed(LAYOUT.encode(wire.StepValues(), CPU).tolist())
    assert not wire.failed(LAYOUT.encode(wire.StepValues(raw_loss=math.nan), CPU).tolist())
