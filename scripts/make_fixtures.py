"""Run zoo scenarios for real and store what they wrote as test fixtures under tests/fixtures/real/<scenario>/.

Per scenario: `stdout.log` (byte for byte, tqdm `\\r` included), `trainer_state.json` (or `raw_log.json` for the
raw-engine loop), the TensorBoard event files under `tb/`, and `meta.json` (scenario, versions, DeepSpeed
config, expected signature and onset, return code, date).

    PYTHONPATH=src python scripts/make_fixtures.py                # the default set
    PYTHONPATH=src python scripts/make_fixtures.py bf16-nan ...    # only these
    PYTHONPATH=src python scripts/make_fixtures.py --out DIR NAME ...   # somewhere else
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import sys
import tempfile
from importlib import metadata
from pathlib import Path

from lossguard.probe.launch import run_scenario
from lossguard.probe.scenarios import SCENARIOS

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "real"
MAX_FIXTURE_BYTES = 200_000

DEFAULT_SET = [
    "healthy-zero1", "healthy-zero2", "healthy-zero3", "healthy-ga", "healthy-lora", "healthy-fp16",
    "healthy-bf16", "memorization", "masked-labels", "bf16-nan", "fp16-overflow", "lora-reentrant",
]


def versions() -> dict[str, str]:
    out = {}
    for name in ("torch", "deepspeed", "transformers", "accelerate", "peft"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


def collect(name: str, run_dir: Path, dest: Path, returncode: int, wall_s: float) -> int:
    """Copy a run's outputs into `dest`; returns the fixture's size in bytes."""
    scenario = SCENARIOS[name]
    if dest.exists():
        shutil.rmtree(dest)
    (dest / "tb").mkdir(parents=True)
    shutil.copy(run_dir / "stdout.log", dest / "stdout.log")
    for state in ("trainer_state.json", "raw_log.json"):
        if (run_dir / state).exists():
            shutil.copy(run_dir / state, dest / state)
    for event in sorted((run_dir / "tb").rglob("events.out.tfevents.*")):
        shutil.copy(event, dest / "tb" / event.name)
    meta = {
        "scenario": name,
        "description": scenario.description,
        "engine": scenario.engine,
        "versions": versions(),
        "world_size": 2,
        "ds_config": scenario.ds_config,
        "trainer_args": scenario.trainer,
        "fault": scenario.fault,
        "expected_signature": scenario.signature,
        "expected_onset_step": scenario.onset_step,
        "healthy_twin": scenario.twin,
        "expected_to_die": scenario.dies,
        "returncode": returncode,
        "wall_s": round(wall_s, 1),
        "date": dt.date.today().isoformat(),
    }
    (dest / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="*", default=DEFAULT_SET)
    parser.add_argument("--out", type=Path, default=FIXTURES)
    args = parser.parse_args(argv)
    failures = []
    for name in args.scenarios:
        with tempfile.TemporaryDirectory(prefix=f"zoo-{name}-") as tmp:
            result = run_scenario(name, tmp)
            expected_rc_ok = (result.returncode != 0) == SCENARIOS[name].dies
            size = collect(name, Path(tmp), args.out / name, result.returncode, result.wall_s)
        flag = "" if expected_rc_ok and size < MAX_FIXTURE_BYTES else "  <-- CHECK"
        print(f"{name:20s} rc={result.returncode:3d} wall={result.wall_s:5.1f}s size={size / 1000:6.1f} KB{flag}")
        if flag:
            failures.append(name)
    if failures:
        print("unexpected return code or oversize fixture:", ", ".join(failures), file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
