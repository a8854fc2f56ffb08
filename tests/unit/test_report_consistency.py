"""No report contradicts its own facts. Over the real logs (../shared/reallogs) and logs written here that
state their precision: a cause whose mechanism needs bf16, fp16 or a ZeRO-1/2 reduction between ranks is
never first when the report's own facts show it false, and "what would decide" never asks for a fact the
report already shows (its facts, or a column its records hold)."""

from pathlib import Path

import pytest

from lossguard.api import analyze
from lossguard.diagnose import clues as C
from lossguard.diagnose.catalog import CAUSES

ROOT = Path(__file__).resolve().parents[2]
REAL_LOGS = ROOT.parent / "shared" / "reallogs"


def _needing(clue, level=C.ALWAYS) -> set[str]:
    return {rule.id for rule in CAUSES if rule.level(clue) is level}


NEEDS_BF16, NEEDS_FP16 = _needing(C.BF16), _needing(C.FP16)
NEEDS_ZERO12, NEEDS_RANKS = _needing(C.ZERO12), _needing(C.MULTI_RANK)
# A shown fact -> the words of the ask that would request it.
ASKED_AS = {"zero_stage": "the ZeRO stage", "overlap_comm": "overlap_comm:", "deepspeed_version": "DeepSpeed version",
            "torch_version": "the torch version", "check_grad_overflow": "check_grad_overflow"}


def _contradictions(result: dict) -> list[str]:
    facts, causes, problems = result["facts"], result["causes"], []
    if causes:
        first = causes[0]["id"]
        if facts.get("bf16") is False and first in NEEDS_BF16:
            problems.append(f"{first} first although bf16 is off")
        if facts.get("fp16") is False and first in NEEDS_FP16:
            problems.append(f"{first} first although fp16 is off")
        if facts.get("zero_stage") in (0, 3) and first in NEEDS_ZERO12:
            problems.append(f"{first} first although ZeRO stage is {facts['zero_stage']}")
        if facts.get("world_size") == 1 and first in NEEDS_RANKS:
            problems.append(f"{first} first on a single rank")
    asks = [c["decided_by"] for c in causes if c["decided_by"]] + result["deciding_facts"]
    for fact, words in ASKED_AS.items():
        if fact in facts:
            problems += [f"asks for {fact} ({facts[fact]!r} is shown): {ask}" for ask in asks if words in ask]
    if "bf16" in facts or "fp16" in facts:
        problems += [f"asks for the precision, shown: {ask}" for ask in asks if "the precision" in ask]
    return problems


def _real_cases():
    if not (REAL_LOGS / "labels.json").exists():
        return []
    return sorted(p for p in REAL_LOGS.iterdir() if (p / "case.json").exists())


@pytest.mark.skipif(not _real_cases(), reason=f"no real-log set at {REAL_LOGS}")
def test_no_real_log_report_contradicts_its_own_facts():
    found = {}
    for case in _real_cases():
        logs = [str(p) for p in sorted(case.iterdir()) if p.is_file() and p.name not in ("case.json", "config.txt")]
        if problems := _contradictions(analyze(logs).to_dict()):
            found[case.name] = problems
    assert not found


_HEALTHY = [f"{{'loss': {2.5 - 0.02 * i:.4f}, 'grad_norm': {1 + 0.01 * i:.4f}, 'learning_rate': 2e-05, "
            f"'epoch': {0.01 * i:.2f}}}" for i in range(1, 21)]
_DEAD = ["{'loss': nan, 'grad_norm': nan, 'learning_rate': 2e-05, 'epoch': 0.3}"] * 5


@pytest.mark.parametrize("header", [
    ["TrainingArguments(", "bf16=False,", "fp16=False,", "learning_rate=2e-05,", ")"],
    ["TrainingArguments(_n_gpu=1, bf16=False, fp16=True, gradient_checkpointing=False)"],
    ["[2024-05-01 10:00:00,000] [INFO] [config.py:1000:print]   bfloat16_enabled ............. False",
     "[2024-05-01 10:00:00,000] [INFO] [config.py:1000:print]   zero_optimization_stage ...... 3"],
], ids=["fp32-pretty", "fp16-one-line", "ds-dump-zero3"])
def test_a_log_that_states_its_precision_gets_no_cause_its_header_rules_out(tmp_path, header):
    log = tmp_path / "train.log"
    log.write_text("\n".join(header + _HEALTHY + _DEAD) + "\n")
    result = analyze([str(log)]).to_dict()
    assert result["verdict"] == "broken" and result["facts"], result["facts"]
    assert not _contradictions(result)
    if result["facts"].get("bf16") is False:
        assert all(c["id"] not in NEEDS_BF16 or c["confidence"] == "unlikely" for c in result["causes"])


def test_a_run_summarys_nan_training_loss_is_training_evidence(tmp_path):
    """`train_loss` nan in the run summary is the training side failing too: the report never says that only
    the evaluation loss is non-finite (and blames an evaluation batch) when the summary shows otherwise."""
    log = tmp_path / "train.log"
    rows = ["{'loss': 2.1, 'learning_rate': 1e-05, 'epoch': 0.5}", "{'loss': 2.0, 'learning_rate': 1e-05, 'epoch': 1.0}",
            "{'eval_loss': nan, 'eval_runtime': 5.3, 'epoch': 1.0}"]
    summary = "{'train_runtime': 100.0, 'train_samples_per_second': 3.2, 'train_loss': nan, 'epoch': 1.0}"
    log.write_text("\n".join(rows + [summary]) + "\n")
    causes = analyze([str(log)]).to_dict()["causes"]
    assert causes[0]["id"] != "eval-batch-nan"
    assert not any("only the evaluation loss" in line for c in causes for line in c["evidence"])
    log.write_text("\n".join(rows + [summary.replace("nan", "2.05")]) + "\n")  # the twin: training finite
    assert analyze([str(log)]).to_dict()["causes"][0]["id"] == "eval-batch-nan"
