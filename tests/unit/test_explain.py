"""`lossguard explain`: every topic it lists explains, in-process and through the real CLI, and nothing a
user reads cites the project's internal notes (KNOWLEDGE.md), which ship with no install."""

import ast
import re
from pathlib import Path

import pytest

import lossguard
from lossguard import explain as docs
from lossguard.detectors import registered
from lossguard.diagnose.signatures import SIGNATURES
from lossguard.lint.rules import all_rules

INTERNAL = re.compile(r"KNOWLEDGE|\b[B-G][1-9]\b(?! ?[-–])|§")


def _every_topic() -> list[str]:
    topics = list(SIGNATURES) + [f().code for f in registered()] + [r.code for r in all_rules()] + ["formats"]
    return topics


def test_the_listing_names_every_signature_detector_and_rule():
    listed = {key for key, _ in docs.topics()}
    missing = set(_every_topic()) - listed
    assert not missing, missing


@pytest.mark.parametrize("topic", _every_topic())
def test_every_topic_explains_without_internal_references(topic):
    text = docs.explain(topic)
    assert text and topic.lower() in text.lower()
    assert not INTERNAL.search(text), INTERNAL.search(text).group(0)


def test_a_rule_shows_its_doc_evidence_and_examples():
    text = docs.explain("DSC101")
    assert "overlap_comm" in text and "https://github.com/deepspeedai/DeepSpeed/pull/5606" in text
    assert "flagged" in text and "valid" in text and "--fix gives" in text


def test_cli_explains_every_rule_code_as_a_user_runs_it(cli):
    """Issue #15: `lossguard explain DSC101` was an internal error for every rule code."""
    for rule in all_rules():
        proc = cli("explain", rule.code)
        assert proc.returncode == 0, (rule.code, proc.stderr.decode()[-300:])
        assert proc.stdout.decode().startswith(rule.code)


def test_cli_unknown_topic_is_one_line_and_exit_2(cli):
    proc = cli("explain", "NOPE999")
    assert proc.returncode == 2
    assert proc.stderr.decode().strip().count("\n") == 0 and "NOPE999" in proc.stderr.decode()


def _docstrings(tree, kinds) -> set[int]:
    return {id(node.body[0].value) for node in ast.walk(tree) if isinstance(node, kinds) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}


# Docstrings a user reads: rule and detector classes (`explain` prints them) and CLI commands (`--help`).
_SHOWN_DOCSTRINGS = ("lint/rules/", "detectors/", "cli/")


def test_no_string_a_user_sees_cites_knowledge():
    """Messages, titles, help texts and the docstrings `explain` / `--help` print; developer docstrings and
    comments may cite the notes."""
    root = Path(lossguard.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text())
        where = path.relative_to(root).as_posix()
        shown = where.startswith(_SHOWN_DOCSTRINGS)
        skip = _docstrings(tree, (ast.Module,) if shown else (ast.Module, ast.ClassDef, ast.FunctionDef))
        offenders += [f"{where}:{node.lineno}" for node in ast.walk(tree)
                      if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
                      and "KNOWLEDGE" in node.value]
    assert not offenders, "\n".join(offenders)


@pytest.mark.parametrize("code", sorted(f().code for f in registered() if f().predicts))
def test_a_detector_shows_what_its_mechanism_predicts_in_each_column(code):
    """`explain CODE` prints the rule's `predicts` table: every column and what the mechanism predicts there."""
    detector = next(f() for f in registered() if f().code == code)
    text = docs.explain(code)
    table = text.split("what its mechanism predicts in each column", 1)[1]
    for column, what in detector.predicts.items():
        assert re.search(rf"^  {re.escape(column)} +{re.escape(what)}$", table, re.M), (column, table)


def test_no_comment_or_doc_cites_the_developer_notes():
    """A clone holds no ../shared: code comments, docstrings, docs and the README cite the known-issues table's
    ids, never the developer notes they were written from."""
    root = Path(lossguard.__file__).parents[2]
    files = [*(root / "src").rglob("*.py"), *(root / "docs").rglob("*.md"), root / "README.md",
             *(root / "scripts").rglob("*.py"), *(root / "bench").rglob("*.py"), *(root / "examples").rglob("*")]
    offenders = [str(p.relative_to(root)) for p in files if p.is_file() and p.suffix in (".py", ".md", ".json", ".yaml")
                 and "KNOWLEDGE" in p.read_text(errors="replace")]
    assert not offenders, offenders
