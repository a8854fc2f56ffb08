"""How often is `lossguard analyze` right on logs real users posted?

Runs the analysis (in-process, the same call `lossguard analyze --format json` makes) on every case of a
real-log set: a directory of case folders (each with its log file(s), case.json and optional config.txt)
and a labels.json at the top that gives, per case id, the accepted verdicts, the accepted signatures
(empty list: any) and, where the thread established the cause, the accepted `cause_ids`: the first ranked
cause's id must be one of them (strict: its id, never a keyword found somewhere in the report). Prints
verdict, signature and first-cause accuracy, how many wrong first causes were called likely, how many
healthy runs were called broken, how many logs were refused (exit 2), and each miss with what was expected.

With --variants it also runs every case through each meaning-preserving rewrite of bench/log_variants.py
(prefixes, paste remnants, CRLF, colour codes, noise lines, a cut head, per-node copies, HF quoting) and
prints, per rewrite, how many variant runs keep an accepted verdict and signature (and the top cause).

    python bench/real_logs.py [--root ../shared/reallogs] [--json] [--variants]
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
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
    top_confidence: str = ""  # the first cause's rank word (likely / possible / unlikely)
    candidates: list = field(default_factory=list)  # every ranked cause id, in order
    top_share: float = 0.0  # the first cause's share of the scores
    top_shown: bool = False  # one of its deciding facts holds on the inputs (the cap allows "likely")
    refusal: str = ""
    verdict_ok: bool = False
    signature_ok: bool = False
    expected: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.verdict_ok and self.signature_ok and self.strict_cause_ok is not False

    @property
    def strict_cause_ok(self) -> bool | None:
        """causes[0].id is one of the label's cause_ids; None where the label names no cause id."""
        accepted = self.expected.get("cause_ids")
        return None if not accepted else self.top_cause in accepted

    @property
    def likely_wrong(self) -> bool:
        """A first cause called likely that the label's cause_ids do not accept (or on a case the label calls
        healthy only): the confident folklore the strict score counts against."""
        if self.top_confidence != "likely":
            return False
        if self.expected.get("cause_ids"):
            return self.top_cause not in self.expected["cause_ids"]
        return _is_healthy_only(self.expected)


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
        diagnosis = analyze([str(p) for p in log_files(case_dir)])
    except SourceError as exc:
        outcome.refusal = str(exc)[:160]
        return outcome
    result = diagnosis.to_dict()
    if diagnosis.causes:
        outcome.top_share, outcome.top_shown = diagnosis.causes[0].confidence, diagnosis.causes[0].shown
    outcome.verdict, outcome.signature = result["verdict"], result["signature"]
    causes = result.get("causes") or []
    outcome.top_cause = causes[0]["id"] if causes else ""
    outcome.top_confidence = causes[0]["confidence"] if causes else ""
    outcome.candidates = [c["id"] for c in causes]
    outcome.verdict_ok = outcome.verdict in label.get("verdict", [])
    accepted = label.get("signature") or []
    outcome.signature_ok = not accepted or outcome.signature in accepted
    return outcome


def score_all(root: Path) -> list[Outcome]:
    labels = json.loads((root / "labels.json").read_text())
    return [score_case(d, labels[case_id(d)]) for d in case_dirs(root) if case_id(d) in labels]


def evidence_start(log: Path, outcome: Outcome) -> int | None:
    """The first line of the evidence for what the whole log shows: the shortest head that gets the same
    broken verdict and signature ends the evidence, and the latest line from which that head still gets it
    starts it. None for a log not called broken (no evidence to keep)."""
    return None if outcome.verdict != "broken" else _evidence_start(log, outcome.signature)


@functools.cache  # one search per log, not one per cut share
def _evidence_start(log: Path, signature: str | None) -> int:
    outcome = Outcome(log.parent.name, verdict="broken", signature=signature)
    lines = log.read_text(errors="replace").splitlines()
    with tempfile.TemporaryDirectory() as tmp:
        part = Path(tmp) / log.name
        end = next((n for n in range(1, len(lines) + 1) if _shows(part, lines[:n], outcome)), len(lines))
        return next((s for s in range(end - 1, -1, -1) if _shows(part, lines[s:end], outcome)), 0)


def _shows(path: Path, lines: list[str], outcome: Outcome) -> bool:
    from lossguard.api import analyze
    from lossguard.sources.base import SourceError

    path.write_text("\n".join(lines) + "\n")
    try:
        result = analyze([str(path)])
    except SourceError:
        return False
    return result.verdict == "broken" and result.signature == outcome.signature


def variant_transform(name: str, log: Path, outcome: Outcome):
    import log_variants

    if name in log_variants.DROP_SHARES:
        return log_variants.drop_head(log_variants.DROP_SHARES[name], evidence_start(log, outcome))
    return log_variants.TRANSFORMS[name]


def score_variant(case_dir: Path, label: dict, name: str, original: Outcome) -> Outcome | None:
    """The case scored on its logs rewritten by transformation `name`; None where it does not apply."""
    with tempfile.TemporaryDirectory() as tmp:
        variant_dir = Path(tmp) / case_dir.name
        variant_dir.mkdir()
        applied = False
        for log in log_files(case_dir):
            text = log.read_bytes().decode("utf-8", errors="replace")
            rewritten = variant_transform(name, log, original)(text)
            applied |= rewritten is not None
            (variant_dir / log.name).write_bytes((text if rewritten is None else rewritten).encode())
        return score_case(variant_dir, label) if applied else None


def score_variants(root: Path, outcomes: list[Outcome]) -> dict[str, list[Outcome | None]]:
    import log_variants

    labels = json.loads((root / "labels.json").read_text())
    by_case = {o.case: o for o in outcomes}
    dirs = [d for d in case_dirs(root) if case_id(d) in labels]
    return {name: [score_variant(d, labels[case_id(d)], name, by_case[d.name]) for d in dirs]
            for name in log_variants.NAMES}


def print_variants(variants: dict[str, list[Outcome | None]]) -> None:
    print("variants (verdict+signature kept / runs; all three kept; skipped where the rewrite would change "
          "what the log says):")
    misses = []
    for name, runs in variants.items():
        ran = [o for o in runs if o is not None]
        kept = sum(o.verdict_ok and o.signature_ok for o in ran)
        print(f"  {name:12s}: {kept:3d}/{len(ran):3d} kept, {sum(o.passed for o in ran):3d} all three, "
              f"{len(runs) - len(ran):3d} skipped")
        misses += [(name, o) for o in ran if not (o.verdict_ok and o.signature_ok)]
    print(f"  total       : {sum(o.verdict_ok and o.signature_ok for _, runs in [(0, [o for r in variants.values() for o in r if o])] for o in runs)}"
          f"/{sum(o is not None for r in variants.values() for o in r)} kept")
    for name, o in misses:
        got = f"REFUSED: {o.refusal}" if o.verdict is None else f"{o.verdict}/{o.signature}"
        print(f"  miss {name:12s} {o.case}: got {got}")


def _is_healthy_only(label: dict) -> bool:
    return "healthy" in label.get("verdict", []) and "broken" not in label.get("verdict", [])


def print_table(outcomes: list[Outcome]) -> None:
    total = len(outcomes)

    def share(count: int) -> str:
        return f"{count:3d}/{total} ({100 * count / max(total, 1):3.0f}%)"

    print(f"cases                 : {total}")
    print(f"verdict right         : {share(sum(o.verdict_ok for o in outcomes))}")
    print(f"signature right       : {share(sum(o.verdict_ok and o.signature_ok for o in outcomes))}")
    strict = [o for o in outcomes if o.expected.get("cause_ids")]
    print(f"strict first cause    : {sum(bool(o.strict_cause_ok) for o in strict):3d}/{len(strict)} of the cases "
          "with cause_ids (causes[0].id in the list)")
    print(f"  right cause ranked  : {sum(any(c in o.expected['cause_ids'] for c in o.candidates) for o in strict):3d}"
          f"/{len(strict)} among the candidates")
    likely = [o for o in strict if o.top_confidence == "likely"]
    print(f"likely precision      : {sum(bool(o.strict_cause_ok) for o in likely):3d}/{len(likely)} of the "
          "'likely' first causes on cases with cause_ids are right")
    print(f"likely coverage       : {len(likely):3d}/{len(strict)} of the cases with cause_ids get a 'likely' "
          "first cause")
    print(f"wrong and likely      : {sum(o.likely_wrong for o in outcomes):3d} (any case: a likely first cause "
          "not in cause_ids, or on a healthy-only case)")
    print("likely threshold sweep (first causes shown by a deciding fact, cases with cause_ids): share >= t")
    for t in (0.3, 0.35, 0.4, 0.45, 0.5, 0.6):
        hit = [o for o in strict if o.top_shown and o.top_share >= t]
        right = sum(bool(o.strict_cause_ok) for o in hit)
        print(f"  t={t:.2f}: precision {right}/{len(hit)}, coverage {len(hit)}/{len(strict)}")
    print(f"all right             : {share(sum(o.passed for o in outcomes))}")
    print(f"healthy called broken : {sum(_is_healthy_only(o.expected) and o.verdict == 'broken' for o in outcomes)}"
          f"/{sum(_is_healthy_only(o.expected) for o in outcomes)}")
    print(f"refused (exit 2)      : {sum(o.verdict is None for o in outcomes)}")
    print("misses:")
    for o in outcomes:
        if o.passed:
            continue
        got = f"REFUSED: {o.refusal}" if o.verdict is None else f"{o.verdict}/{o.signature} cause={o.top_cause}"
        want = f"{'|'.join(o.expected.get('verdict', []))}/{'|'.join(o.expected.get('signature') or ['any'])}"
        if o.expected.get("cause_ids"):
            want += f" cause_id={'|'.join(o.expected['cause_ids'])}"
        if o.top_cause:
            got += f" ({o.top_confidence}; candidates {', '.join(o.candidates)})"
        print(f"  {o.case}\n      got  {got}\n      want {want}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=DEFAULT_SET)
    parser.add_argument("--json", action="store_true", help="one JSON object per case instead of the table")
    parser.add_argument("--variants", action="store_true",
                        help="also score every case under each meaning-preserving rewrite (bench/log_variants.py)")
    args = parser.parse_args()
    if not (args.root / "labels.json").exists():
        sys.exit(f"{args.root}: no labels.json here; pass --root DIR of a real-log set")
    sys.path.insert(0, str(ROOT / "src"))
    sys.path.insert(0, str(ROOT / "bench"))
    outcomes = score_all(args.root)
    if args.json:
        for o in outcomes:
            print(json.dumps({**asdict(o), "passed": o.passed}))
    else:
        print_table(outcomes)
    if args.variants:
        print_variants(score_variants(args.root, outcomes))


if __name__ == "__main__":
    main()
