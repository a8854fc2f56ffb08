"""`lossguard watch` over a real PyTorch Lightning run: its progress bar (tqdm, or rich, Lightning's default
where rich is installed) is read as it redraws, so a NaN or an exploding loss is caught and the job halted
within two steps of the onset, not after the bar's last redraw (issue #24); and `analyze` of the watch log
agrees with the live report."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from .watch_helpers import assert_no_orphans, report, run_watch

pytest.importorskip("lightning")

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("make_lightning_logs", ROOT / "scripts" / "make_lightning_logs.py")
make_lightning_logs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(make_lightning_logs)


@pytest.mark.parametrize("bar", ["tqdm", "rich"])
@pytest.mark.parametrize("mode", ["nan", "explode"])
def test_watch_halts_a_dying_lightning_run_within_two_steps(tmp_path, mode, bar):
    job = [sys.executable, "-c", make_lightning_logs.JOB, mode, bar]
    result = run_watch("--halt-on", "broken", "--report", str(tmp_path / "r"), "--", *job, timeout=300)
    data = report(tmp_path / "r")
    # An LR explosion is divergence when the loss stays finite for two logs at three times its start, else the
    # NaN it turns into.
    expected = {"nonfinite"} if mode == "nan" else {"divergence", "nonfinite"}
    assert data["verdict"] == "broken" and data["signature"] in expected, data["findings"]
    assert data["watch"]["halted"] is True and result.returncode == 3, result.stderr[-2000:]
    onset = data["onset_step"]
    # Caught at the step the bar showed when the diagnosis turned broken (the toy job paces its steps at
    # 100 ms, a small real step: on a loaded machine a 20 ms step ran on four steps while the signal travelled).
    # (A bar redraws once at a new count still showing the last batch's loss: the step read live can be one early.)
    assert data["watch"]["halt_step"] <= onset + 2 < 40, (onset, data["watch"])
    offline = json.loads(subprocess.run([sys.executable, "-m", "lossguard", "analyze", "--format", "json",
                                         str(tmp_path / "r" / "watch.log")], capture_output=True,
                                        env={"PYTHONPATH": str(ROOT / "src")}).stdout)
    assert (offline["verdict"], offline["signature"], offline["onset_step"]) == ("broken", data["signature"], onset)
    assert_no_orphans(data)
