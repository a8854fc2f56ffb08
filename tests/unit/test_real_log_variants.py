"""Metamorphic tests of `lossguard analyze` on the real logs (../shared/reallogs): a log rewritten the way
capturing or pasting it could have (bench/log_variants.py: launcher / logger prefixes, GitHub paste remnants,
CRLF, colour codes, trailing spaces, tabs, noise lines, a cut head, per-node copies, transformers-5 quoting)
keeps the outcome of its base case: where the unrewritten log gets a verdict and signature its label accepts
(the acceptance rule of bench/real_logs.py), every rewrite of it must too, and where its first cause is one
the label's cause_ids accept, the rewrite's first cause must be too. A case whose own log is not yet
accepted guards nothing and is skipped with that reason, so the test grows as cases come to pass (for a
mechanism's reason, never by a list). A rewrite that would change what a given log says is skipped, with the
reason. Skips when the set is absent."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REAL_LOGS = ROOT.parent / "shared" / "reallogs"
HAVE_SET = (REAL_LOGS / "labels.json").exists()

pytestmark = pytest.mark.skipif(not HAVE_SET, reason=f"no real-log set at {REAL_LOGS} (shared data not present)")


def _load(name: str):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there; real_logs imports log_variants
    spec.loader.exec_module(module)
    return module


VARIANTS = _load("log_variants")
CASES = sorted(p.name for p in REAL_LOGS.iterdir() if (p / "case.json").exists()) if HAVE_SET else []


@pytest.fixture(scope="module")
def bench():
    return _load("real_logs")


@pytest.fixture(scope="module")
def labels(bench):
    import json

    return json.loads((REAL_LOGS / "labels.json").read_text())


@pytest.fixture(scope="module")
def originals():
    return {}  # each case's own outcome, scored once: the cut-head rewrites keep its evidence


@pytest.mark.parametrize("transform", VARIANTS.NAMES)
@pytest.mark.parametrize("case", CASES)
def test_a_meaning_preserving_rewrite_keeps_its_base_cases_accepted_outcome(bench, labels, originals, case,
                                                                               transform):
    case_dir = REAL_LOGS / case
    label = labels.get(bench.case_id(case_dir))
    if label is None:
        pytest.skip("case has no label")
    if case not in originals:
        originals[case] = bench.score_case(case_dir, label)
    base = originals[case]
    if not (base.verdict_ok and base.signature_ok):
        pytest.skip(f"the unrewritten log is not accepted yet (got {base.verdict}/{base.signature}): a rewrite of "
                    "it has no accepted outcome to keep")
    variant = bench.score_variant(case_dir, label, transform, originals[case])
    if variant is None:
        pytest.skip(f"{transform} does not apply to this log or would change what it says (the reason is in "
                    "bench/log_variants.py)")
    assert variant.verdict is not None, variant.refusal
    assert (variant.verdict_ok, variant.signature_ok) == (True, True), (variant.verdict, variant.signature,
                                                                        label)
    if base.strict_cause_ok:  # the first cause the thread established is kept too
        assert variant.strict_cause_ok, (variant.top_cause, label["cause_ids"])
