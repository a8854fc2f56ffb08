"""A version rule states no fact the known-issues table (lossguard.knowledge) holds: its issue id, its
evidence links and its fix are the table's own, so a corrected window, link or fix changes lint with it."""

from __future__ import annotations

import pytest

from lossguard.knowledge import deepspeed as kd
from lossguard.knowledge import training as kt
from lossguard.lint.api import lint
from lossguard.lint.rules import get_rule
from lossguard.lint.rules.base import fix_of

TABLE_RULES = [("ENV302", kt.GA_LOSS_SCALE), ("ENV303", kd.BF16_UNCLIPPED), ("ENV304", kd.ZERO3_STREAM_RACE)]


@pytest.mark.parametrize(("code", "issue"), TABLE_RULES, ids=[code for code, _ in TABLE_RULES])
def test_the_rule_reads_its_issue(code, issue):
    rule = type(get_rule(code))
    assert rule.issues == (issue.id,)
    assert rule.evidence is issue.sources  # the same object: stated once, in the table
    flagged = next(e for e in rule.examples if not e.valid)
    findings = lint(flagged.config, flagged.args, flagged.env, select=[code])
    assert findings and all(fix_of(f).description == issue.fix for f in findings)
    assert all(f.data["evidence"] == list(issue.sources) for f in findings)
