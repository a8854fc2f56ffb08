"""Score lossguard on the fault zoo: every scenario run for real, judged by every tool.

For each scenario of `lossguard.probe.scenarios` (tiny GPT-2 / VLM, real DeepSpeed, two CPU ranks), run
the job with lossguard's live guard attached (no halt, so the logs are complete), then judge:
  live     the guard's own findings, from the job's events JSONL (what it saw while the job ran)
  stdout   `lossguard analyze` on the job's stdout
  state    `lossguard analyze` on its trainer_state.json (raw-loop scenarios have none)
  runmedic the nearest peer from PyPI (`runmedic diagnose --json`) on the same stdout and state files
and print one table (detected / signature / onset latency in steps per tool) and the totals per tool:
recall on fault scenarios, false alarms on healthy ones, signature accuracy, median latency.

    python bench/zoo.py                       # run every scenario (about 10-15 min on 2 cores)
    python bench/zoo.py --fixtures            # no runs: score the committed tests/fixtures/real logs
    python bench/zoo.py --only bf16-nan,masked-labels --keep runs/zoo
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from lossguard.api import analyze  # noqa: E402
from lossguard.probe.preflight import TRAINING_STACK  # noqa: E402
from lossguard.probe.scenarios import SCENARIOS  # noqa: E402
from lossguard.sources.base import SourceError  # noqa: E402

# runmedic's check names -> the closest DESIGN.md signature, to score its signature accuracy fairly.
RUNMEDIC_SIGNATURES = {
    "non_finite": "nonfinite", "nan": "nonfinite", "divergence": "divergence", "loss_spike": "loss-spike",
    "plateau": "not-learning", "stalled": "not-learning", "flat_loss": "not-learning",
    "zero_grad": "no-grad-flow", "vanishing_gradients": "no-grad-flow", "exploding_gradients": "divergence",
    "lr_zero": "lr-zero", "overfitting": "memorization", "no_learning": "not-learning",
    "grad_spikes": "loss-spike",
}
# Signatures that name the same death: a live guard sees the raw NaN that the log hides as 0.0.
SAME = {"nonfinite": {"nonfinite", "nonfinite-hidden"}, "nonfinite-hidden": {"nonfinite", "nonfinite-hidden"}}
TOOLS = ["live", "stdout", "state", "runmedic:stdout", "runmedic:state"]


@dataclass
class Verdict:
    detected: bool
    signature: str | None
    onset: int | None

    def cell(self, expected_sig: str | None, expected_onset: int | None) -> str:
        if not self.detected:
            return "-"
        ok = _matches(self.signature, expected_sig)
        lat = "" if self.onset is None or expected_onset is None else f" {self.onset - expected_onset:+d}"
        return f"{'' if ok else '!'}{self.signature or '?'}{lat}"


def _matches(got: str | None, expected: str | None) -> bool:
    return got == expected or got in SAME.get(expected or "", set())


def judge_lossguard(path: Path) -> Verdict | None:
    if not path.exists():
        return None
    try:
        d = analyze([path])
    except SourceError:  # the job crashed before logging anything: nothing for any tool to judge
        return Verdict(False, None, None)
    return Verdict(d.verdict == "broken" or (d.verdict == "warning"), d.signature, d.onset_step)


def judge_live(events: Path) -> Verdict | None:
    files = sorted(events.glob("events-rank*.jsonl"))
    if not files:
        return None
    return judge_lossguard(events)


def judge_runmedic(path: Path) -> Verdict | None:
    exe = shutil.which("runmedic") or str(Path(sys.executable).with_name("runmedic"))
    if not path.exists() or not Path(exe).exists():
        return None
    proc = subprocess.run([exe, "diagnose", str(path), "--json"], capture_output=True, text=True, timeout=120)
    try:
        runs = json.loads(proc.stdout)
    except ValueError:
        return Verdict(False, None, None)
    findings = [f for run in runs for f in run.get("findings", []) if f.get("severity") in ("critical", "warning")]
    if not findings:
        return Verdict(False, None, None)
    first = min(findings, key=lambda f: (f.get("step") is None, f.get("step") or 0))
    step = first.get("step")
    return Verdict(True, RUNMEDIC_SIGNATURES.get(first.get("check"), first.get("check")),
                   None if step is None else int(step))


def run_one(name: str, out: Path) -> Path:
    from lossguard.probe.launch import run_scenario

    if (out / "stdout.log").exists():
        return out  # --keep reuse
    run_scenario(name, out, guard_events=str(out / "events"), halt_on=None, timeout_s=400)
    return out


def crashed(run_dir: Path) -> bool:
    """The job died loudly (a traceback, non-zero exit) before logging a step: not a silent death."""
    log = run_dir / "stdout.log"
    if not log.exists():
        return False
    text = log.read_bytes()
    return b"Traceback" in text and b"'loss'" not in text and b" loss " not in text


def score(name: str, run_dir: Path) -> dict[str, Verdict | None]:
    expected = SCENARIOS[name]
    healthy_expected = expected.signature in (None, "memorization")
    out = {
        "live": judge_live(run_dir / "events"),
        "stdout": judge_lossguard(run_dir / "stdout.log"),
        "state": judge_lossguard(run_dir / "trainer_state.json"),
        "runmedic:stdout": judge_runmedic(run_dir / "stdout.log"),
        "runmedic:state": judge_runmedic(run_dir / "trainer_state.json"),
    }
    if healthy_expected:  # memorisation is healthy: only a broken/warning verdict counts as a detection
        for verdict in out.values():
            if verdict is not None and verdict.signature == "memorization":
                verdict.detected = False
    return out


def totals(rows: list[tuple[str, dict[str, Verdict | None]]]) -> list[str]:
    lines = []
    for tool in TOOLS:
        faults = [(n, r[tool]) for n, r in rows if r.get(tool) is not None
                  and SCENARIOS[n].signature not in (None, "memorization")]
        healthy = [(n, r[tool]) for n, r in rows if r.get(tool) is not None
                   and SCENARIOS[n].signature in (None, "memorization")]
        hits = [(n, v) for n, v in faults if v.detected]
        right = [1 for n, v in hits if _matches(v.signature, SCENARIOS[n].signature)]
        latencies = [v.onset - SCENARIOS[n].onset_step for n, v in hits
                     if v.onset is not None and SCENARIOS[n].onset_step is not None]
        false_alarms = [n for n, v in healthy if v.detected]
        recall = f"{len(hits)}/{len(faults)} ({len(hits) / len(faults):.0%})" if faults else "n/a"
        accuracy = f"{len(right)}/{len(hits)} ({len(right) / len(hits):.0%})" if hits else "n/a"
        median = f"{statistics.median(latencies):+.1f}" if latencies else "n/a"
        lines.append(f"{tool:<16} recall {recall:<14} false alarms {len(false_alarms)}/{len(healthy):<4} "
                     f"signature {accuracy:<14} median latency {median} steps"
                     + (f"  (false alarms: {', '.join(false_alarms)})" if false_alarms else ""))
    return lines


def main() -> None:
    from lossguard.probe.job import stop_jobs_on_signals

    with stop_jobs_on_signals():  # a killed bench run stops the scenario it was running, ranks included
        run_zoo()


def run_zoo() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="comma-separated scenario names")
    parser.add_argument("--fixtures", action="store_true", help="score tests/fixtures/real instead of running")
    parser.add_argument("--keep", help="keep (and reuse) run directories here")
    args = parser.parse_args()
    if not args.fixtures:
        from lossguard.probe.launch import job_env
        from lossguard.probe.preflight import MissingPiece, check_job_stack

        try:
            check_job_stack("the zoo's jobs", env=job_env(), modules=(*TRAINING_STACK, "peft"))
        except MissingPiece as exc:
            print(f"zoo: {exc}", file=sys.stderr)
            sys.exit(2)
    names = args.only.split(",") if args.only else list(SCENARIOS)
    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="lossguard-zoo-"))
    rows = []
    header = f"{'scenario':<22} {'expected':<22} " + " ".join(f"{t:<22}" for t in TOOLS)
    print(header)
    print("-" * len(header))
    for name in names:
        if args.fixtures:
            run_dir = ROOT / "tests" / "fixtures" / "real" / name
            if not run_dir.exists():
                continue
        else:
            run_dir = run_one(name, base / name)
        if crashed(run_dir):
            s = SCENARIOS[name]
            print(f"{name:<22} {(s.signature or 'healthy') + '@-':<22} crashed loudly before its first step "
                  "(DeepSpeed raised); not a silent death, left out of the totals", flush=True)
            continue
        row = score(name, run_dir)
        rows.append((name, row))
        s = SCENARIOS[name]
        expected = f"{s.signature or 'healthy'}@{s.onset_step if s.onset_step is not None else '-'}"
        cells = " ".join(f"{'n/a' if v is None else v.cell(s.signature, s.onset_step):<22}" for v in row.values())
        print(f"{name:<22} {expected:<22} {cells}", flush=True)
    print("\ncell: signature and onset latency in steps (lossguard onset - true onset); '!' wrong signature; "
          "'-' nothing above info")
    print("\n".join(totals(rows)))
    if not args.keep and not args.fixtures:
        print(f"\nruns kept in {base}" if os.environ.get("LOSSGUARD_KEEP") else "")


if __name__ == "__main__":
    main()
