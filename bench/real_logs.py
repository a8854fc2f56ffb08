"""How often is `lossguard analyze` right on logs real users posted?

Runs the analysis (in-process, the same call `lossguard analyze --format json` makes) on every case of a
real-log set: a directory of case folders (each with its log file(s), case.json and optional config.txt)
and a labels.json at the top that gives, per case id, the accepted verdicts, the accepted signatures
(empty list: any) and optional cause keywords (any of which the top-ranked cause should mention). Prints
verdict, signature and cause accuracy, how many healthy runs were called broken, how many logs were
refused (exit 2), and each miss with what was expected.

    python bench/real_logs.py [--root ../shared/reallogs] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SET = ROOT.parent / "shared" / "reallogs"
_NOT_LOGS = {"case.json", "config.txt"}


@dataclass
class Outcome:
    case: str
    verdict: str | None = None  # None: refused (exit 2)
    signature: str | None = None
    top_cause: str = ""
    refusal: str = ""
    verdict_ok: bool = False
    signature_ok: bool = False
    cause_ok: bool = False
    expected: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.verdict_ok and self.signature_ok and self.cause_ok


def case_dirs(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir() and (p / "case.json").exists())


def case_id(case_dir: Path) -> str:
    return case_dir.name.split("-", 1)[0]


def log_files(case_dir: Path) -> list[Path]:
    return sorted(p for p in case_dir.iterdir() if p.is_file() and p.name not in _NOT_LOGS)


def score_case(case_dir: Path, label: dict) -> Outcome:
    from lossguard.api import analyze
    from lossguard.sources.base import SourceError

    outcome = Outcome(case_dir.name, expected=label)
    try:
        result = analyze([str(p) for p in log_files(case_dir)]).to_dict()
    except SourceError as exc:
        outcome.refusal = str(exc)[:160]
        return outcome
    outcome.verdict, outcome.signature = result["verdict"], result["signature"]
    causes = result.get("causes") or []
    outcome.top_cause = causes[0]["id"] if causes else ""
    outcome.verdict_ok = outcome.verdict in label.get("verdict", [])
    accepted = label.get("signature") or []
    outcome.signature_ok = not accepted or outcome.signature in accepted
    keywords = [k.lower() for k in label.get("cause") or []]
    top_text = json.dumps(causes[0]).lower() if causes else ""
    outcome.cause_ok = not keywords or any(k in top_text for k in keywords)
    return outcome


def score_all(root: Path) -> list[Outcome]:
    labels = json.loads((root / "labels.json").read_text())
    return [score_case(d, labels[case_id(d)]) for d in case_dirs(root) if case_id(d) in labels]


def _is_healthy_only(label: dict) -> bool:
    return "healthy" in label.get("verdict", []) and "broken" not in label.get("verdict", [])


def print_table(outcomes: list[Outcome]) -> None:
    total = len(outcomes)

    def share(count: int) -> str:
        return f"{count:3d}/{total} ({100 * count / max(total, 1):3.0f}%)"

    with_causes = [o for o in outcomes if o.expected.get("cause")]
    print(f"cases                 : {total}")
    print(f"verdict right         : {share(sum(o.verdict_ok for o in outcomes))}")
    print(f"signature right       : {share(sum(o.verdict_ok and o.signature_ok for o in outcomes))}")
    print(f"top cause right       : {sum(o.cause_ok and o.verdict is not None for o in with_causes):3d}/"
          f"{len(with_causes)} of the cases with cause keywords")
    print(f"all three right       : {share(sum(o.passed for o in outcomes))}")
    print(f"healthy called broken : {sum(_is_healthy_only(o.expected) and o.verdict == 'broken' for o in outcomes)}"
          f"/{sum(_is_healthy_only(o.expected) for o in outcomes)}")
    print(f"refused (exit 2)      : {sum(o.verdict is None for o in outcomes)}")
    print("misses:")
    for o in outcomes:
        if o.passed:
            continue
        got = f"REFUSED: {o.refusal}" if o.verdict is None else f"{o.verdict}/{o.signature} cause={o.top_cause}"
        want = f"{'|'.join(o.expected.get('verdict', []))}/{'|'.join(o.expected.get('signature') or ['any'])}"
        if o.expected.get("cause"):
            want += f" cause~{'|'.join(o.expected['cause'])}"
        print(f"  {o.case}\n      got  {got}\n      want {want}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=DEFAULT_SET)
    parser.add_argument("--json", action="store_true", help="one JSON object per case instead of the table")
    args = parser.parse_args()
    if not (args.root / "labels.json").exists():
        sys.exit(f"{args.root}: no labels.json here; pass --root DIR of a real-log set")
    sys.path.insert(0, str(ROOT / "src"))
    outcomes = score_all(args.root)
    if args.json:
        for o in outcomes:
            print(json.dumps({**asdict(o), "passed": o.passed}))
    else:
        print_table(outcomes)


if __name__ == "__main__":
    main()
