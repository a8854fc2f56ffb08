"""A symptom is never its own cause: a log that shows only a failure signature (no config, no versions, no
column beyond what the signature needs) gets no `likely` cause, for every signature. The causes are ranked
from what their mechanisms predict (diagnose/catalog.py); the facts that define a signature count for none of
its causes, so only a fact that tells the rivals apart can make one likely.

Two levels: the ranking itself, for every signature, on run evidence that holds exactly the signature's own
symptoms; and the whole analysis, on a minimal log written here for each signature a log can
show (the analysis must find that signature, or the test proves nothing)."""

import math

import pytest

from lossguard.api import analyze
from lossguard.diagnose.catalog import CAUSES
from lossguard.diagnose.ranking import rank_causes
from lossguard.diagnose.signatures import SIGNATURES
from lossguard.knowledge.conditions import Event, Fired, Measured, RunEvidence


def _symptoms_only(signature: str) -> RunEvidence:
    """Every clue that defines the signature (`symptom_of`), holding, and nothing else. (A finding that says
    more than the signature, such as GRAD003's "0 trainable parameters", is a fact that may decide.)"""
    run = RunEvidence()
    for rule in CAUSES:
        for clue, _ in rule.predicts:
            if signature not in clue.symptom_of:
                continue
            if isinstance(clue.subject, Event):
                run.events[clue.subject.name] = 20
            elif isinstance(clue.subject, Fired):
                run.fired.add(clue.subject.code)
            elif isinstance(clue.subject, Measured):  # a value on the side the clue tests
                run.measured[(clue.subject.code, clue.subject.key)] = clue.value
    return run


@pytest.mark.parametrize("signature", sorted(SIGNATURES))
def test_the_signatures_own_symptoms_make_no_cause_likely(signature):
    ranked = rank_causes(signature, _symptoms_only(signature))
    assert all(c.likelihood != "likely" for c in ranked), [(c.id, c.likelihood, c.evidence) for c in ranked]


def _dicts(rows):
    return [repr(row) for row in rows]


def _epoch(i):
    return round(0.01 * i, 4)


# signature -> the lines of a log that shows it and nothing else (transformers' printed log dicts, or
# DeepSpeed's loss-scaler lines). Losses fall a little before a failure, as a run's do.
MINIMAL_LOGS = {
    "nonfinite": _dicts([{"loss": round(2.5 - 0.01 * i, 4), "epoch": _epoch(i)} for i in range(1, 31)]
                        + [{"loss": float("nan"), "epoch": _epoch(i)} for i in range(31, 41)]),
    "nonfinite-hidden": _dicts([{"loss": round(2.5 - 0.01 * i, 4), "grad_norm": round(1 + 0.1 * math.sin(i), 4),
                                 "epoch": _epoch(i)} for i in range(1, 31)]
                               + [{"loss": 0.0, "grad_norm": 1.4142135623730951, "epoch": _epoch(i)}
                                  for i in range(31, 41)]),
    "zero-loss": _dicts([{"loss": 0.0, "epoch": _epoch(i)} for i in range(1, 41)]),
    "masked-labels": _dicts([{"loss": 0.0, "grad_norm": 0.0, "epoch": _epoch(i)} for i in range(1, 41)]),
    "fp16-overflow": [f"[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: {2 ** max(16 - i, 0)}, "
                      f"reducing to {2 ** max(15 - i, 0)}" for i in range(30)],
    "no-grad-flow": _dicts([{"loss": round(2.3 + 0.01 * math.sin(i), 4), "grad_norm": 0.0, "epoch": _epoch(i)}
                            for i in range(1, 41)]),
    "lr-zero": _dicts([{"loss": round(2.3 + 0.01 * math.sin(i), 4), "learning_rate": 0.0, "epoch": _epoch(i)}
                       for i in range(1, 41)]),
    "not-learning": _dicts([{"loss": 2.3456, "epoch": _epoch(i)} for i in range(1, 41)]),
    "divergence": _dicts([{"loss": round(2.5 - 0.01 * i, 4), "epoch": _epoch(i)} for i in range(1, 21)]
                         + [{"loss": round(2.3 * 1.25 ** (i - 20), 4), "epoch": _epoch(i)} for i in range(21, 41)]),
    "loss-spike": _dicts([{"loss": round((2.5 - 0.01 * i) * (8 if i == 20 else 1), 4), "epoch": _epoch(i)}
                          for i in range(1, 41)]),
    "memorization": _dicts([{"loss": round(2.5 * 0.7 ** i, 6),
                             "grad_norm": round(0.5 * 0.9 ** i + 0.01 * math.sin(i) + 0.02, 4), "epoch": _epoch(i)}
                            for i in range(1, 41)]),
}
# Only the live guard sees ranks disagree: no single log shows it (the ranking level above covers it).
LIVE_ONLY = {"rank-desync"}


def test_every_signature_has_a_minimal_log_or_is_live_only():
    assert set(MINIMAL_LOGS) | LIVE_ONLY == set(SIGNATURES)


@pytest.mark.parametrize("signature", sorted(MINIMAL_LOGS))
def test_a_log_that_shows_only_a_signature_gets_no_likely_cause(tmp_path, signature):
    log = tmp_path / "train.log"
    log.write_text("\n".join(MINIMAL_LOGS[signature]) + "\n")
    result = analyze([str(log)]).to_dict()
    assert result["signature"] == signature, (result["verdict"], result["signature"])
    assert all(c["confidence"] != "likely" for c in result["causes"]), \
        [(c["id"], c["confidence"], c["evidence"]) for c in result["causes"]]
    first = result["causes"][0] if result["causes"] else None
    if first is not None and first["decided_by"]:
        assert first["decided_by"] in result["deciding_facts"]  # it says what would decide
