"""One meaning of halt_on: "broken" / "warning" in the guard mean the verdict the diagnosis (and watch) gives."""

from lossguard.core.findings import Finding, Severity
from lossguard.diagnose.signatures import SIGNATURES, finding_verdict
from lossguard.monitor import options


def _finding(signature, severity):
    return Finding(code="TEST001", name="test", severity=severity, message="m", signature=signature)


def test_the_guard_reads_signature_ids_from_the_diagnosis_table():
    assert set(options.SIGNATURES) == set(SIGNATURES)


def test_broken_means_the_diagnosis_verdict_not_a_severity():
    rules = options.halt_rules("broken")
    dead = _finding("nonfinite", Severity.CRITICAL)
    spike = _finding("loss-spike", Severity.ERROR)  # an error-level spike is a warning verdict, not a dead run
    masking = _finding("masked-labels", Severity.WARNING)
    assert [finding_verdict(f.signature, f.severity) for f in (dead, spike, masking)] == ["broken", "warning",
                                                                                          "warning"]
    assert options.should_halt(rules, [dead, spike, masking]) == [dead]
    assert options.should_halt(options.halt_rules("warning"), [spike, masking]) == [spike, masking]
    assert options.should_halt(options.halt_rules("error"), [spike]) == [spike]  # a severity still means one
