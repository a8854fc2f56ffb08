"""DSC115 and DSC116 against the real stack: a two-rank Trainer + DeepSpeed run (CPU, gloo, bf16 ZeRO-2).

- A config without `gradient_clipping`: `--max_grad_norm 1e-3` is not what the engine clips at, and one SGD
  step at lr 1 moves the weights ~170x more than with `"gradient_clipping": "auto"` (on DeepSpeed >= 0.19.3
  the engine clips at its own default 1.0; before, at nothing).
- A DeepSpeed `WarmupLR` block with `--lr_scheduler_type cosine`: the logged LR stays at its peak after
  warm-up, where the Trainer's own scheduler decays it.
lint flags both configs with the arguments the runs used.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lossguard.lint.api import lint
from lossguard.probe.launch import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

JOB = Path(__file__).parent / "lint_jobs" / "hazard_job.py"
SRC = Path(__file__).resolve().parents[2] / "src"
SCENARIOS = ["clip-absent", "clip-auto", "sched-deepspeed", "sched-trainer"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("hazards")
    env = {**os.environ, "PYTHONPATH": str(SRC), "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    torchrun = Path(sys.executable).parent / "torchrun"
    proc = subprocess.run([str(torchrun), "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port",
                           str(free_port()), str(JOB), str(out), *SCENARIOS], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return {name: json.loads((out / name / "summary.json").read_text()) for name in SCENARIOS}


def _installed_deepspeed() -> str:
    from importlib.metadata import version

    return version("deepspeed")


def test_max_grad_norm_is_not_applied_without_gradient_clipping(runs):
    absent, auto = runs["clip-absent"], runs["clip-auto"]
    assert auto["engine_clipping"] == pytest.approx(1e-3)  # "auto" carries --max_grad_norm
    assert absent["engine_clipping"] != pytest.approx(1e-3)  # DeepSpeed's default instead
    assert absent["update_norm"] > 20 * auto["update_norm"]
    args = {"per_device_train_batch_size": 4, "max_grad_norm": 1e-3, "bf16": True, "world_size": 2}
    env = {"deepspeed": _installed_deepspeed()}
    assert "DSC115" in {f.code for f in lint(absent["config"], args, env)}
    assert "DSC115" not in {f.code for f in lint(auto["config"], args, env)}


def test_a_deepspeed_scheduler_block_replaces_the_cosine_asked_for(runs):
    ds_lr, trainer_lr = runs["sched-deepspeed"]["learning_rates"], runs["sched-trainer"]["learning_rates"]
    assert len(ds_lr) == len(trainer_lr) == 8
    assert ds_lr[2:] == [pytest.approx(1e-3)] * 6  # WarmupLR: flat at the peak after 2 warm-up steps
    assert trainer_lr[-1] < 0.1 * trainer_lr[2]  # cosine decays
    args = {"per_device_train_batch_size": 4, "lr_scheduler_type": "cosine", "warmup_steps": 2, "bf16": True}
    assert "DSC116" in {f.code for f in lint(runs["sched-deepspeed"]["config"], args)}
    assert "DSC116" not in {f.code for f in lint(runs["sched-trainer"]["config"], args)}
