"""What a finding says agrees with its own step and with the data beside it.

One step per message: a non-finite finding is placed at its onset (a pending non-finite norm that a later
log confirms), and its message names that step or no step, never the later one. And LOSS004 says why the
loss is flat from what the run measured of its weights: updated (update ratio above 0, a fingerprint that
changed), not updated (ratio 0, one fingerprint), or unknown (a log with neither), never a reason the
records contradict. Every stream goes through the whole engine, one by one (`feed`, the live path) and in
batches (`feed_all`, analyze's path)."""

import math
import re

import pytest

from lossguard.core.engine import Engine
from lossguard.core.records import Record
from lossguard.detectors import make_detectors


def findings(records, *, batched: bool):
    engine = Engine(make_detectors())
    if batched:
        engine.feed_all(records)
    else:
        for record in records:
            engine.feed(record)
    return engine.finish().findings


def live(step, *, raw, grad, lr, rank=0, **extra):
    """A live guard record: the raw loss is also the loss."""
    return Record(step=step, rank=rank, signals={"raw_loss": raw, "loss": raw, "grad_norm": grad, "lr": lr, **extra},
                  source="live")


def logged(step, loss, grad, lr):
    return Record(step=step, signals={"loss": loss, "grad_norm": grad, "lr": lr})


def steps_named(message: str) -> set[int]:
    return {int(n) for n in re.findall(r"\bsteps? (\d+)", message)}


NONFINITE = {
    # live: an inf norm beside a finite loss at step 10 (maybe a skip), then the raw loss is NaN at 11
    "live-nan-after-inf-norm": [live(s, raw=2.0 - 0.01 * s, grad=1.0, lr=1e-4 * s) for s in range(1, 10)]
    + [live(10, raw=1.9, grad=math.inf, lr=1e-3), live(11, raw=math.nan, grad=math.nan, lr=1.1e-3)],
    # analyze: inf norm beside a finite loss at step 8, then an inf norm beside a 0.0 loss (NaN filter) at 9
    "log-zero-after-inf-norm": [logged(s, 2.0 - 0.01 * s, 1.0, 1e-4 * s) for s in range(1, 8)]
    + [logged(8, 1.92, math.inf, 8e-4), logged(9, 0.0, math.inf, 9e-4)],
    # a loss that blew up beside a second inf norm
    "log-jump-after-inf-norm": [logged(s, 2.0 - 0.01 * s, 1.0, 1e-4 * s) for s in range(1, 8)]
    + [logged(8, 1.92, math.inf, 8e-4), logged(9, 40.0, math.inf, 9e-4)],
    # the norm stays inf for three logs while the LR moves on
    "log-persistent-inf-norm": [logged(s, 2.0 - 0.01 * s, 1.0, 1e-4 * s) for s in range(1, 8)]
    + [logged(s, 1.92, math.inf, 1e-4 * s) for s in range(8, 12)],
    # plain: NaN at once
    "log-nan-loss": [logged(s, 2.0 - 0.01 * s, 1.0, 1e-4 * s) for s in range(1, 6)] + [logged(6, math.nan, 1.0, 6e-4)],
}
ONSET = {"live-nan-after-inf-norm": 10, "log-zero-after-inf-norm": 8, "log-jump-after-inf-norm": 8,
         "log-persistent-inf-norm": 8, "log-nan-loss": 6}


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("name", list(NONFINITE))
def test_a_nonfinite_finding_names_only_its_own_step(name, batched):
    found = [f for f in findings(NONFINITE[name], batched=batched) if f.code == "LOSS001"]
    assert len(found) == 1, [f.message for f in found]
    finding = found[0]
    assert finding.step == ONSET[name]
    assert steps_named(finding.message) <= {finding.step}, finding.message
    for other in findings(NONFINITE[name], batched=batched):
        assert steps_named(other.message) <= {other.step}, (other.code, other.message)


def test_the_onset_message_still_says_which_went_first():
    """The data fields the diagnosis reads are kept: a norm beside a finite loss went first."""
    finding = next(f for f in findings(NONFINITE["live-nan-after-inf-norm"], batched=False) if f.code == "LOSS001")
    assert finding.data["loss_finite"] == 1 and finding.data["signal"] == "raw_loss"
    assert "gradient norm is inf at step 10, then raw loss is nan" in finding.message
    jump = next(f for f in findings(NONFINITE["log-jump-after-inf-norm"], batched=True) if f.code == "LOSS001")
    assert jump.data["loss_exploded"] == 1 and "blew up" in jump.message


def flat_run(measured: dict, n: int = 30) -> list[Record]:
    """A loss within 0.5% of 4.58 from step 1 (never the same value twice), healthy grad norms; `measured`:
    step -> signals (update_ratio, param_fingerprint) added at that step."""
    return [Record(step=i + 1, rank=0, source="live",
                   signals={"loss": 4.58 + 0.01 * math.sin(i), "grad_norm": 1.3, "lr": 1e-3, **measured.get(i + 1, {})})
            for i in range(n)]


RATIOS_MOVING = {1: {"update_ratio": 0.049, "param_fingerprint": 10.0},
                 4: {"update_ratio": 0.02, "param_fingerprint": 10.5}}
RATIOS_STILL = {1: {"update_ratio": 0.0, "param_fingerprint": 10.0}, 4: {"update_ratio": 0.0, "param_fingerprint": 10.0}}
PRINTS_MOVING = {1: {"param_fingerprint": 10.0}, 8: {"param_fingerprint": 10.25}}
PRINTS_STILL = {1: {"param_fingerprint": 10.0}, 8: {"param_fingerprint": 10.0}}


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize(("measured", "updated"), [
    (RATIOS_MOVING, 1), (PRINTS_MOVING, 1), (RATIOS_STILL, 0), (PRINTS_STILL, 0), ({}, None)])
def test_a_flat_loss_says_what_the_weights_did(measured, updated, batched):
    found = [f for f in findings(flat_run(measured), batched=batched) if f.code == "LOSS004"]
    assert len(found) == 1
    finding = found[0]
    assert finding.signature == "not-learning" and finding.step == 1
    assert finding.data.get("weights_updated") == updated
    if updated == 1:
        assert "although the weights are being updated" in finding.message
        assert "not being updated" not in finding.message
        assert "nothing to learn" in finding.message and "learning rate is too small" in finding.message
    elif updated == 0:
        assert "the weights are not being updated (" in finding.message and "nothing to learn" not in finding.message
    else:
        assert "either the weights are not being updated" in finding.message and " or they are " in finding.message


def test_the_largest_update_ratio_is_reported():
    finding = next(f for f in findings(flat_run(RATIOS_MOVING), batched=True) if f.code == "LOSS004")
    assert finding.data["max_update_ratio"] == pytest.approx(0.049)
    assert "largest update ratio 0.049" in finding.message


def test_a_loss_that_jumps_to_three_times_its_start_and_stays_there_two_logs_is_divergence():
    """The fast divergence rule: an LR explosion is caught at its second log, not its fifth; a one-log
    spike that comes back down is not divergence."""
    from lossguard.core.engine import Engine
    from lossguard.core.records import Record
    from lossguard.detectors import make_detectors
    from lossguard.diagnose.diagnosis import diagnose

    def run(losses):
        engine = Engine(make_detectors())
        engine.feed_all([Record(step=i, signals={"loss": v, "grad_norm": 1.0, "lr": 1e-3})
                         for i, v in enumerate(losses, 1)])
        return diagnose(engine.finish())

    start = [4.4, 4.3, 4.2, 4.1, 4.0, 3.9, 3.8, 3.7]
    exploded = run(start + [15.1, 18.0, 17.3, 18.9, 19.0, 19.2])
    assert (exploded.signature, exploded.onset_step) == ("divergence", 9)
    assert any(f.code == "LOSS005" and f.step == 9 and "stayed above three times" in f.message
               for f in exploded.findings)
    spike = run(start + [15.1, 3.6, 3.5, 3.4, 3.3, 3.2, 3.1])
    assert spike.verdict != "broken", [f.message for f in spike.findings]
