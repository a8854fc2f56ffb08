"""ZeRO-2 configs as LLaVA, Qwen, GLM-4 and InternLM-XComposer shipped them (re-typed fixtures, see
tests/fixtures/lint/README.md), with the DeepSpeed versions their users ran: each gets the finding its
users needed, `--fix` clears every safe-fixable finding, and the fixed config still loads in the real
DeepSpeed config parser."""

from __future__ import annotations

from pathlib import Path

import pytest

from lossguard.lint.api import fix_document, fixable, lint_context, run_rules
from lossguard.lint.args import load_args_file, parse_command
from lossguard.lint.document import read_document
from lossguard.lint.env import versions_from_file

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lint"

# project -> (config, freeze, cmd, extra args file, codes its users needed)
PROJECTS = {
    "llava": ("llava_zero2.json", "llava.freeze", "llava.cmd", None, {"DSC101", "DSC103", "DSC104", "DSC105"}),
    "qwen967": ("qwen967_zero2.json", "qwen.freeze", "qwen.cmd", None, {"DSC101", "DSC102", "DSC104", "DSC105"}),
    "qwen": ("qwen_zero2.json", "qwen.freeze", "qwen.cmd", None, {"DSC101", "DSC104", "DSC105"}),
    "glm4": ("glm4_zero2.json", "glm4.freeze", "glm4.cmd", "glm4_lora.yaml", {"DSC101", "DSC104", "DSC105"}),
    "xcomposer": ("xcomposer_zero2.json", "xcomposer.freeze", "xcomposer.cmd", None, {"DSC101", "DSC104", "DSC105"}),
}


def _inputs(name):
    config, freeze, cmd, args_file, expected = PROJECTS[name]
    args = parse_command((FIXTURES / cmd).read_text())
    if args_file:
        file_args = load_args_file(str(FIXTURES / args_file))
        args = {**file_args, **{k: v for k, v in args.items() if k not in ("origin", "framework")}}
    return read_document(str(FIXTURES / config)), args, versions_from_file(str(FIXTURES / freeze)), expected


@pytest.mark.parametrize("name", list(PROJECTS))
def test_project_gets_the_finding_its_users_needed(name):
    doc, args, versions, expected = _inputs(name)
    findings = run_rules(lint_context(doc.data, args, versions, source=doc.source))
    # one finding per root cause: DSC103/DSC104 ride inside DSC101 (its `also`), their text in its message
    codes = {f.code for f in findings} | {code for f in findings for code in f.data.get("also", [])}
    assert expected <= codes, codes
    overlap = next(f for f in findings if f.code == "DSC101")
    assert overlap.location == "zero_optimization.overlap_comm" and versions["deepspeed"] in overlap.message
    assert str(overlap.severity) == "error"


def test_llava_bucket_message_names_hidden_squared():
    doc, args, versions, _ = _inputs("llava")
    message = next(f.message for f in run_rules(lint_context(doc.data, args, versions)) if f.code == "DSC101")
    assert "Same cause: DSC103" in message and "16,777,216" in message and "vicuna-7b" in message


def test_glm4_yaml_args_are_read():
    _, args, _, _ = _inputs("glm4")
    assert args["bf16"] is True and args["lora"] is True and args["world_size"] == 8


@pytest.mark.parametrize("unsafe", [False, True])
@pytest.mark.parametrize("name", list(PROJECTS))
def test_fix_clears_safe_findings_and_loads_in_deepspeed(name, unsafe):
    doc, args, versions, _ = _inputs(name)
    result = fix_document(doc, {"training_args": args, "env": versions}, unsafe=unsafe)
    assert result.warnings == []  # edited in place
    assert result.data["zero_optimization"]["overlap_comm"] is False
    # issue #15: no memory added in the round that removes its reason (overlap off -> buckets need not grow)
    bucket = doc.data["zero_optimization"].get("reduce_bucket_size")
    assert result.data["zero_optimization"].get("reduce_bucket_size") == bucket
    assert doc.text.splitlines()[:3] == result.text.splitlines()[:3]  # layout kept
    after = run_rules(lint_context(result.data, args, versions))
    assert not [f for f in after if fixable(f, unsafe)]
    pytest.importorskip("deepspeed")
    schema = run_rules(lint_context(result.data, args, versions, options={"deepspeed_schema": True}), ["DSC002"])
    assert schema == [], schema[0].message if schema else ""


def test_current_deepspeed_needs_no_overlap_fix():
    doc, args, _, _ = _inputs("qwen")
    codes = {f.code for f in run_rules(lint_context(doc.data, args, {"deepspeed": "0.19.8"}))}
    assert not codes & {"DSC101", "DSC104", "DSC105"}
