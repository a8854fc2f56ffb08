"""Contract tests over every registered detector (STYLE.md 9): empty, missing, odd and NaN input."""

import math

import pytest

from lossguard.core.detector import Detector
from lossguard.core.findings import Finding, Severity
from lossguard.core.records import EVAL, EVENT, Record, event
from lossguard.detectors import registered
from lossguard.diagnose.signatures import SIGNATURES

FACTORIES = registered()


def test_codes_and_names_are_unique_and_documented():
    detectors = [f() for f in FACTORIES]
    codes = [d.code for d in detectors]
    names = [d.name for d in detectors]
    assert len(codes) == len(set(codes)) and len(names) == len(set(names))
    for detector in detectors:
        assert isinstance(detector, Detector)
        assert detector.signature is None or detector.signature in SIGNATURES
        assert (type(detector).__doc__ or "").startswith(detector.code), detector.code


ODD_STREAMS = {
    "empty": [],
    "no-signals": [Record(step=1), Record(step=None), Record(step=2, kind=EVAL)],
    "nan-everywhere": [Record(step=i, signals={k: math.nan for k in ("loss", "grad_norm", "lr", "loss_scale",
                                                                        "num_label_tokens", "eval_loss",
                                                                        "param_fingerprint", "skipped_steps")},
                              rank=i % 2) for i in range(20)],
    "inf-and-negative": [Record(step=i, signals={"loss": -math.inf, "grad_norm": -1.0, "lr": -3.0})
                         for i in range(10)],
    "events-without-data": [event(name, step=None) for name in (
        "overflow", "scale-at-minimum", "tokenization-mismatch", "trainable-params", "no-grad",
        "trainable-not-in-optimizer", "facts", "lr-before-step")],
    "steps-going-backwards": [Record(step=10 - i, signals={"loss": 1.0, "grad_norm": 0.0, "lr": 0.0})
                              for i in range(10)],
}


@pytest.mark.parametrize("stream", list(ODD_STREAMS))
@pytest.mark.parametrize("factory", FACTORIES, ids=lambda f: f().code)
def test_every_detector_survives_odd_input(factory, stream):
    detector = factory()
    out = []
    for record in ODD_STREAMS[stream]:
        out += detector.observe(record)
    out += detector.finish()
    assert all(isinstance(f, Finding) and isinstance(f.severity, Severity) for f in out)


def test_healthy_decay_raises_nothing_above_info():
    from lossguard.core.engine import Engine
    from lossguard.detectors import make_detectors

    engine = Engine(make_detectors())
    for step in range(1, 200):
        engine.feed(Record(step=step, signals={"loss": 4.0 * 0.99 ** step + 0.5, "grad_norm": 1.0 + 0.3 * math.sin(step),
                                               "lr": 1e-4 if step > 1 else 0.0, "epoch": step / 200}))
    result = engine.finish()
    assert [f for f in result.findings if f.severity > Severity.INFO] == []


def test_a_detector_that_raises_is_reported_once_and_switched_off():
    from lossguard.core.engine import Engine

    class Broken:
        code, name, signature = "TEST999", "test.broken", None

        def observe(self, record):
            raise RuntimeError("boom")

        def finish(self):
            return []

    engine = Engine(detectors=[Broken()])
    for step in range(5):
        engine.feed(Record(step=step, signals={"loss": 1.0}))
    findings = engine.finish().findings
    assert [f.code for f in findings] == ["LG000"] and "boom" in findings[0].message
    assert engine.stats.num_train == 5


def test_findings_per_code_are_capped():
    from lossguard.core.engine import _MAX_FINDINGS, Engine

    class Chatty:
        code, name, signature = "TEST998", "test.chatty", None

        def observe(self, record):
            return [Finding("TEST998", "test.chatty", Severity.INFO, "x", step=record.step)]

        def finish(self):
            return []

    engine = Engine(detectors=[Chatty()])
    for step in range(_MAX_FINDINGS + 50):
        engine.feed(Record(step=step))
    result = engine.finish()
    assert len(result.findings) == _MAX_FINDINGS and result.num_suppressed == 50


def test_event_helper_is_an_event():
    assert event("overflow", step=3).kind == EVENT


def test_wants_name_only_catalog_signals_or_known_events():
    from lossguard.core.signals import SIGNALS
    from lossguard.sources.patterns import EVENT_PATTERNS
    from lossguard.sources.readers.guard_lines import EVENTS as GUARD_EVENTS

    events = {name for name, _ in EVENT_PATTERNS} | {"no-grad", "trainable-not-in-optimizer", "facts", *GUARD_EVENTS}
    for factory in FACTORIES:
        wants = factory().wants
        if wants is not None:
            assert wants <= set(SIGNALS) | events, (factory, wants - set(SIGNALS) - events)


def test_series_keeps_a_lone_nan_and_stays_bounded():
    from lossguard.core.series import Downsampled

    line = Downsampled(capacity=64)
    for step in range(100_000):
        line.add(step, float("nan") if step == 77_777 else 1.0)
    assert any(v != v for _, v in line.points)
    assert len(line.points) <= 64 + 64 // 8
    dead = Downsampled(capacity=64)
    for step in range(100_000):
        dead.add(step, float("nan") if step % 2 else 1.0)
    assert len(dead.points) <= 64 + 64 // 8
