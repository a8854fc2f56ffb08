"""W&B runs written offline by the real wandb (scripts/make_tracker_runs.py), read through wandb's own reader of a
run's transaction log: each run's diagnosis, the HF WandbCallback's keys on the Trainer's steps, NaN and Inf,
several runs, and the message without wandb."""

from __future__ import annotations

import math
import shutil
import subprocess
import sys

import pytest

from lossguard.api import analyze
from lossguard.core.records import EVAL, TRAIN
from lossguard.sources.wandb_offline import WandbOfflineSource, runs_under
from tests.conftest import FIXTURES, ROOT

pytest.importorskip("wandb")  # the `wandb` extra; installed by `make setup` (the dev extra)

WANDB = FIXTURES / "trackers" / "wandb"
# The script writes the runs in this order, one second apart: the run directories' names order them.
NAMES = ("healthy", "nan", "overfit")
EXPECTED = {"healthy": ("healthy", None, None), "nan": ("broken", "nonfinite-hidden", 30), "overfit": ("warning", None, None)}


def _log(name: str):
    return runs_under(WANDB)[NAMES.index(name)]


@pytest.mark.parametrize("name", NAMES)
def test_each_offline_run_directory_gets_its_diagnosis(name):
    d = analyze([_log(name).parent])
    assert (d.verdict, d.signature, d.onset_step) == EXPECTED[name]
    steps = 80 if name == "overfit" else 60
    assert (d.result.stats.num_train, d.result.stats.num_eval) == (steps // 2, steps // 10)
    assert (d.result.stats.first_step, d.result.stats.last_step) == (2, steps)  # train/global_step, not _step
    assert (name == "overfit") == any(f.code == "EVAL001" for f in d.findings)
    assert d.result.facts.bf16 is True and d.result.facts.transformers_version == "4.57.1"  # the run's config


def test_the_callbacks_keys_map_to_signals_and_nan_and_inf_survive():
    records = list(WandbOfflineSource().parse(_log("nan")))
    assert records[0].event == "facts"  # the run's config before its numbers, as a log's config dump
    train = {r.step: r.signals for r in records if r.kind == TRAIN}
    assert set(train[28]) == {"loss", "grad_norm", "lr", "epoch"}  # train/loss, train/grad_norm, ...
    assert math.isnan(train[30]["loss"]) and train[30]["grad_norm"] == math.inf
    assert train[32]["loss"] == 0.0 and math.isnan(train[32]["grad_norm"])
    evals = {r.step: r.signals["eval_loss"] for r in records if r.kind == EVAL}  # eval/loss
    assert sorted(evals) == [10, 20, 30, 40, 50, 60] and evals[20] == 2.1 and math.isnan(evals[40])


def test_the_transaction_log_itself_is_read_and_the_cli_exits_1_on_a_nan_run(cli):
    proc = cli("analyze", _log("nan"), "--format", "json")
    assert proc.returncode == 1 and b'"nonfinite-hidden"' in proc.stdout, proc.stderr
    assert proc.stderr.decode() == ""


def test_a_wandb_directory_of_several_runs_reads_the_latest_and_says_so(cli):
    proc = cli("analyze", WANDB)
    err = proc.stderr.decode()
    assert proc.returncode == 0 and err.count("\n") == 1, err
    assert "3 W&B runs" in err and _log("overfit").parent.name in err and "pass its run directory" in err
    assert "EVAL001" in proc.stdout.decode()


def test_a_run_directory_among_other_logs_is_read_with_them(tmp_path):
    out = tmp_path / "output"
    shutil.copytree(_log("nan").parent, out / "wandb" / _log("nan").parent.name)
    (out / "train.log").write_text("{'loss': 2.61, 'grad_norm': 1.2, 'learning_rate': 2e-06, 'epoch': 0.07}\n")
    d = analyze([out])
    assert d.signature == "nonfinite-hidden" and d.onset_step == 30
    assert any("(wandb)" in u for u in d.gathering.used) and any("train.log" in u for u in d.gathering.used)


def test_a_damaged_transaction_log_is_refused_with_the_next_step(cli, tmp_path):
    bad = tmp_path / "run-abc.wandb"
    bad.write_bytes(b":W&B\x00\x00" + b"\x07" * 200)
    proc = cli("analyze", bad)
    err = proc.stderr.decode()
    assert proc.returncode == 2 and "Traceback" not in err and err.count("\n") == 1, err
    assert "run-abc.wandb" in err and "copy it again" in err


def test_without_wandb_the_message_names_the_extra():
    """A real import failure: `sys.modules['wandb'] = None` makes every import of wandb raise ImportError."""
    code = ("import sys; sys.modules['wandb'] = None; from lossguard.cli.main import main; "
            f"sys.argv = ['lossguard', 'analyze', {str(_log('nan').parent)!r}]; main()")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120,
                          env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
    err = proc.stderr.decode()
    assert proc.returncode == 2 and "Traceback" not in err and err.count("\n") == 1, err
    assert "run-" in err and "needs the `wandb` package" in err and "[wandb]" in err
