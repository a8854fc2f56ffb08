"""Real logs users posted (../shared/reallogs, scored by bench/real_logs.py): no log that holds a metric line
is refused, and every case that passes today keeps passing. The set is read from ../shared; the test skips
when it is absent (a checkout without the shared data)."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REAL_LOGS = ROOT.parent / "shared" / "reallogs"

# Cases whose verdict, signature and strict first cause (where the label names cause_ids) are all right
# (bench/real_logs.py), over the whole set: a change may add ids here, never lose one. A case missing from
# the set fails too, so a renamed or dropped case cannot pass silently.
PASSING = ("001", "002", "003", "004", "005", "006", "007", "008", "009", "010", "011", "012", "013", "014",
           "017", "018", "019", "020", "021", "022", "023", "025", "026", "027", "028", "029", "030", "031",
           "032", "033", "034", "035", "036", "037", "038", "039", "101", "102", "103", "104", "105", "106",
           "107", "108", "109", "110", "111", "112", "113", "114", "115", "116", "117", "118", "119", "120",
           "121", "122", "123", "124", "125", "126", "127", "128", "129", "130", "131", "132", "133", "134",
           "136", "137", "138", "139", "140", "141", "142", "201", "202", "203", "204", "205", "207", "208",
           "209", "210", "211", "212", "213", "214", "215", "216", "217", "220", "221", "222", "223", "224", "225",
           "227", "228", "229", "230", "232", "233", "235", "236", "237", "238", "241", "243")

pytestmark = pytest.mark.skipif(not (REAL_LOGS / "labels.json").exists(),
                                reason=f"no real-log set at {REAL_LOGS} (shared data not present)")


@pytest.fixture(scope="module")
def outcomes():
    spec = importlib.util.spec_from_file_location("real_logs", ROOT / "bench" / "real_logs.py")
    bench = importlib.util.module_from_spec(spec)
    sys.modules["real_logs"] = bench  # dataclasses look their module up there
    spec.loader.exec_module(bench)
    return {o.case.split("-", 1)[0]: o for o in bench.score_all(REAL_LOGS)}


def test_no_real_log_is_refused(outcomes):
    refused = {case: o.refusal for case, o in outcomes.items() if o.verdict is None}
    assert not refused


def test_every_case_that_passed_still_passes(outcomes):
    missing = [case for case in PASSING if case not in outcomes]
    lost = {case: (outcomes[case].verdict, outcomes[case].signature, outcomes[case].top_cause)
            for case in PASSING if case in outcomes and not outcomes[case].passed}
    assert not missing and not lost, (missing, lost)
