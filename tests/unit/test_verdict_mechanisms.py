"""Verdicts from mechanisms (issue #23, item 4): each test states one mechanism on synthetic input, in the
shapes real tools print; where a real log of ../shared/reallogs shows it, that case is one example of it,
never the rule's source."""

from __future__ import annotations

import math

from lossguard.api import analyze
from lossguard.core.engine import Engine
from lossguard.core.records import EVAL, Record, event
from lossguard.detectors import make_detectors
from lossguard.diagnose.diagnosis import diagnose


def run(records):
    engine = Engine(make_detectors())
    engine.feed_all(records)
    return diagnose(engine.finish())


def _analyze(tmp_path, text: str, name: str = "train.log"):
    log = tmp_path / name
    log.write_text(text)
    return analyze([log])


def _mismatch(got: int, expected: int) -> str:
    return f"WARNING: tokenization mismatch: {got} vs. {expected}. #turn = 1. (ignored)\n"


# -- 1. one offset on every sample is the template ------------------------------------------------------

def test_mismatch_warnings_all_off_by_one_offset_are_a_template_cut_of_every_sample(tmp_path):
    """LLaVA/FastChat mask a whole sample when the template's count is off; a wrong template is off by the
    same tokens on every sample (LLaVA #1706: always +14), so every sample is masked: broken."""
    for offset in (14, -1, 4):
        text = "".join(_mismatch(n, n + offset) for n in (149, 187, 204, 210, 234))
        d = _analyze(tmp_path, text)
        assert (d.verdict, d.signature) == ("broken", "masked-labels"), offset
        assert f"{offset:+d}" in d.findings[0].message


def test_mismatch_warnings_with_varying_offsets_stay_a_warning(tmp_path):
    """Offsets that differ from sample to sample are samples cut for their own reasons (truncation, odd turns)."""
    text = "".join(_mismatch(n, n + off) for n, off in ((327, -1), (405, -11), (485, -3), (654, -11), (737, -5)))
    d = _analyze(tmp_path, text)
    assert (d.verdict, d.signature) == ("warning", "masked-labels")


def test_one_sample_or_its_copies_do_not_make_an_offset_constant(tmp_path):
    """One sample (printed again by a second rank) shows an offset, not a rule."""
    d = _analyze(tmp_path, _mismatch(234, 248) * 3)
    assert (d.verdict, d.signature) == ("warning", "masked-labels")


def test_a_constant_offset_beside_a_learning_loss_is_one_sources_template_so_a_warning(tmp_path):
    """A finite, non-zero loss says some samples still train (one data source's template is wrong)."""
    rows = "".join(repr({"loss": 2.0 - i / 20, "grad_norm": 1.1, "learning_rate": 1e-5, "epoch": i / 10}) + "\n"
                   for i in range(12))
    d = _analyze(tmp_path, _mismatch(52, 51) + _mismatch(57, 56) + rows + _mismatch(60, 59))
    assert (d.verdict, d.signature) == ("warning", "masked-labels")
