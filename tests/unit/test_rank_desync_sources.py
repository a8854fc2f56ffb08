"""RANK001 compares a fingerprint only with the same quantity on the other ranks: the guard's (live, or read
back from its events files) with the guard's, a script's printed `param_sum` with the printed one (issue #24:
a healthy job's printed 160.6 was compared with the guard's 54.4 and called a desync)."""

from pathlib import Path

from lossguard.api import analyze
from lossguard.core.records import Record
from lossguard.detectors.ranks import RankDesync

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "probe" / "healthy-bf16-zero2"


def _fp(step, rank, value, source):
    return Record(step=step, rank=rank, signals={"param_fingerprint": value}, source=source)


def _fired(records):
    detector = RankDesync()
    return [f for record in records for f in detector.observe(record)]


def test_the_guards_fingerprint_and_a_printed_sum_are_never_compared():
    records = [_fp(1, 0, 160.606725, "stdout.log"), _fp(1, 0, 54.4458671, "events-rank0.jsonl"),
               _fp(1, 1, 160.606725, "stdout.log"), _fp(1, 1, 54.4458671, "events-rank1.jsonl")]
    assert _fired(records) == []


def test_each_kind_still_catches_a_real_desync():
    guard = [_fp(3, 0, 54.4458671, "events-rank0.jsonl"), _fp(3, 1, 54.49, "events-rank1.jsonl")]
    printed = [_fp(3, 0, 160.6, "train.log"), _fp(3, 1, 161.9, "train.log")]
    live = [_fp(4, 0, 2.0, "live"), _fp(4, 1, 2.5, "live")]
    for records in (guard, printed, live):
        (finding,) = _fired(records)
        assert finding.code == "RANK001" and finding.step in (3, 4)


def test_analyze_of_a_healthy_probe_arm_with_both_kinds_is_healthy():
    diagnosis = analyze([str(FIXTURE)])
    assert diagnosis.verdict == "healthy", [f.message for f in diagnosis.findings]
