"""The verdict is decided once, inside `diagnose()`: an incomplete analysis is one of its inputs, and what
the diagnosis carries (incomplete reasons, the gathering, whether there was anything to judge) is declared
on `Diagnosis`, not attached to it afterwards."""

from __future__ import annotations

from dataclasses import fields

import pytest

from lossguard.api import NothingReadError, analyze
from lossguard.core.engine import Engine
from lossguard.core.records import Record
from lossguard.detectors import make_detectors
from lossguard.diagnose.diagnosis import Diagnosis, diagnose

DECLARED = {f.name for f in fields(Diagnosis)}


def _result(losses):
    engine = Engine(make_detectors())
    engine.feed_all(Record(step=i + 1, signals={"loss": loss}) for i, loss in enumerate(losses))
    return engine.finish()


def _healthy_losses():
    return [2.5 - 0.01 * i for i in range(40)]


def test_an_incomplete_analysis_of_a_healthy_run_is_a_warning_from_diagnose_itself():
    complete = diagnose(_result(_healthy_losses()))
    assert complete.verdict == "healthy" and complete.incomplete == []
    diagnosis = diagnose(_result(_healthy_losses()), incomplete=["not read: b.log: permission denied"])
    assert diagnosis.verdict == "warning"
    assert diagnosis.incomplete == ["not read: b.log: permission denied"]
    last = diagnosis.findings[-1]
    assert last.code == "SRC001" and last.data == {"reasons": ["not read: b.log: permission denied"]}


def test_an_incomplete_analysis_keeps_a_broken_verdict():
    losses = _healthy_losses()[:20] + [float("nan")] * 5
    diagnosis = diagnose(_result(losses), incomplete=["a reason"])
    assert diagnosis.verdict == "broken" and diagnosis.findings[-1].code == "SRC001"


def test_analyze_sets_only_declared_fields(tmp_path):
    """Everything `analyze` hands back on the diagnosis is a field of `Diagnosis` (an overlong line makes
    the analysis incomplete, so the incompleteness path runs)."""
    lines = [f"{{'loss': {2.5 - 0.01 * step:.4f}, 'learning_rate': 1e-05, 'epoch': {step / 100}}}"
             for step in range(1, 31)]
    lines[10] = "#" * (1 << 20) + lines[10]  # a dumped tensor before a log dict, on one line
    log = tmp_path / "train.log"
    log.write_text("\n".join(lines) + "\n")
    diagnosis = analyze([log])
    assert set(vars(diagnosis)) <= DECLARED, set(vars(diagnosis)) - DECLARED
    assert diagnosis.incomplete and diagnosis.verdict == "warning"
    assert diagnosis.gathering is not None and diagnosis.gathering.used


def test_nothing_trained_is_refused_even_when_the_analysis_is_also_incomplete(tmp_path):
    """The refusal reads the verdict on what was read, before incompleteness makes a healthy one a warning."""
    log = tmp_path / "train.log"
    log.write_text("Loading checkpoint shards: 100%\n" + "#" * (1 << 20) + "{'epoch': 0.1}\nsaving model\n")
    with pytest.raises(NothingReadError, match="no training metrics seen"):
        analyze([log])
