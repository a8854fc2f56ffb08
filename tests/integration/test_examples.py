"""Every live-guard example under examples/ runs as docs/live.md shows it: a few steps on CPU, one process, exit
status 0 and the guard's events written; with `--nan-at K` it halts at step K, saves, and exits 3
(`exit_code_on_halt`). The TRL run is the proof that `LossguardCallback` works in `SFTTrainer` as it is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
# example -> the packages it needs, what a halt at step K leaves in OUT
EXAMPLES = {
    "live_hf": (["transformers"], "trainer/checkpoint-{k}/trainer_state.json"),
    "live_trl": (["trl", "datasets"], "trainer/checkpoint-{k}/trainer_state.json"),
    "live_accelerate": (["accelerate", "transformers"], "halt-step{k}"),
    "live_lightning": (["lightning", "transformers"], "halt/lossguard-halt-step{k}.ckpt"),
    "live_raw": ([], "halt-step{k}.pt"),
}
STEPS, NAN_AT = 3, 2


def _run(name: str, out: Path, *extra: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    for package in ["torch", *EXAMPLES[name][0]]:
        pytest.importorskip(package)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / f"{name}.py"), "--out", str(out),
                           "--steps", str(STEPS), *extra], env=env, capture_output=True, text=True, timeout=300)
    events = out / "events" / "events-rank0.jsonl"
    lines = [json.loads(x) for x in events.read_text().splitlines()] if events.exists() else []
    return proc, lines


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_example_runs_and_writes_the_guards_events(tmp_path, name):
    proc, lines = _run(name, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    train = [x for x in lines if x.get("kind") == "train"]
    assert [x["step"] for x in train] == list(range(1, STEPS + 1)), proc.stderr[-3000:]
    assert all(x["signals"]["num_label_tokens"] > 0 and "grad_norm" in x["signals"] for x in train)
    assert [x for x in lines if x["type"] == "finding" and x["severity"] != "info"] == []
    assert lines[-1] == {"type": "end", "halted_at": None, "disabled": False,
                         "steps_by_path": {"detail": STEPS, "summary": 0}}


# The Trainer's, Lightning's and Guard's halt-and-exit paths run in test_live_exit.py / test_live_lightning.py too:
# here by default only TRL's (the proof for SFTTrainer) and the cheapest one.
@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in ("live_trl", "live_raw") else pytest.mark.slow)
                                  for n in EXAMPLES])
def test_example_halts_saves_and_exits_3_on_a_nan(tmp_path, name):
    proc, lines = _run(name, tmp_path, "--nan-at", str(NAN_AT))
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert any(x["type"] == "halt" and x["step"] == NAN_AT and "LOSS001" in x["codes"] for x in lines)
    assert lines[-1]["type"] == "end" and lines[-1]["halted_at"] == NAN_AT
    assert (tmp_path / EXAMPLES[name][1].format(k=NAN_AT)).exists()
    assert not (tmp_path / "final").exists() and not (tmp_path / "final.ckpt").exists()  # the code after training
