"""MLflow stores written by the real mlflow (scripts/make_tracker_runs.py): the file store and the SQLite store
give each run's diagnosis, NaN and Inf survive the SQLite store's encoding, several runs read the latest."""

from __future__ import annotations

import math
import shutil
import sqlite3

import pytest

from lossguard.api import analyze
from lossguard.core.records import EVAL, TRAIN
from lossguard.sources.base import SourceError
from lossguard.sources.mlflow_store import MlflowSource, runs_under
from tests.conftest import FIXTURES

TRACKERS = FIXTURES / "trackers"
MLRUNS, DB = TRACKERS / "mlruns", TRACKERS / "mlflow.db"
EXPECTED = {"healthy": ("healthy", None, None), "nan": ("broken", "nonfinite-hidden", 30), "overfit": ("warning", None, None)}


def _run_dir(name: str):
    return next(run.place for run in runs_under(MLRUNS) if run.name == name)


def _input(store: str, name: str) -> str:
    return str(_run_dir(name)) if store == "files" else f"{DB}#{name}"


@pytest.mark.parametrize("store", ["files", "sqlite"])
@pytest.mark.parametrize("name", EXPECTED)
def test_each_run_of_either_store_gets_its_diagnosis(store, name):
    d = analyze([_input(store, name)])
    assert (d.verdict, d.signature, d.onset_step) == EXPECTED[name]
    # The Trainer logged every 2 steps and evaluated every 10: one record per log, on the Trainer's steps.
    steps = 80 if name == "overfit" else 60
    assert (d.result.stats.num_train, d.result.stats.num_eval) == (steps // 2, steps // 10)
    assert (name == "overfit") == any(f.code == "EVAL001" for f in d.findings)
    # The Trainer's arguments, logged as params, are run facts.
    assert d.result.facts.bf16 is True and d.result.facts.gradient_accumulation_steps == 2


@pytest.mark.parametrize("store", ["files", "sqlite"])
def test_nan_and_inf_come_back_as_nan_and_inf(store):
    path = _run_dir("nan") if store == "files" else DB
    source = MlflowSource(None if store == "files" else _db_run_id("nan"))
    train = {r.step: r.signals for r in source.parse(path) if r.kind == TRAIN}
    assert math.isnan(train[30]["loss"]) and train[30]["grad_norm"] == math.inf
    assert train[32]["loss"] == 0.0 and math.isnan(train[32]["grad_norm"])  # the Trainer's NaN filter artefact
    assert train[28]["lr"] > 0 and "epoch" in train[28]
    evals = {r.step: r.signals["eval_loss"] for r in source.parse(path) if r.kind == EVAL}
    assert evals[20] == 2.1 and math.isnan(evals[40])


def test_the_sqlite_store_holds_them_as_mlflow_encodes_them():
    """What the restoring undoes: MLflow writes a NaN as 0 with is_nan = 1 and clamps Inf to the largest double."""
    with sqlite3.connect(f"{DB.resolve().as_uri()}?mode=ro", uri=True) as db:
        rows = dict(db.execute("SELECT key, value || '/' || is_nan FROM metrics WHERE run_uuid = ? AND step = 30 "
                               "AND key IN ('loss', 'grad_norm')", (_db_run_id("nan"),)).fetchall())
    assert rows == {"loss": "0.0/1", "grad_norm": "1.79769313486232e+308/0"}


def test_the_summary_logged_at_the_last_step_is_not_that_steps_loss():
    last = [r for r in MlflowSource().parse(_run_dir("healthy")) if r.step == 60]
    assert {r.kind for r in last} == {TRAIN, EVAL, "event"}
    summary = next(r for r in last if r.kind == "event")
    assert summary.event == "train-summary" and "train_loss" in summary.data
    assert next(r for r in last if r.kind == TRAIN).signals["loss"] != summary.data["train_loss"]


def test_a_store_of_several_runs_reads_the_latest_started_and_says_how_to_read_another(cli):
    proc = cli("analyze", MLRUNS)
    err = proc.stderr.decode()
    assert proc.returncode == 0 and err.count("\n") == 1, err
    assert "3 MLflow runs" in err and "'overfit'" in err and "pass its run directory" in err
    assert "EVAL001" in proc.stdout.decode()  # the overfitting run was read
    proc = cli("analyze", DB)
    assert "'overfit'" in proc.stderr.decode() and f"{DB}#RUN" in proc.stderr.decode()


def test_a_run_of_the_sqlite_store_is_named_by_id_prefix_or_name_and_the_cli_exits_1_on_it(cli):
    proc = cli("analyze", f"{DB}#{_db_run_id('nan')[:8]}", "--format", "json")
    assert proc.returncode == 1 and b'"nonfinite-hidden"' in proc.stdout
    assert proc.stderr.decode() == ""  # a run chosen by the user: nothing to say
    assert cli("analyze", f"{DB}#healthy").returncode == 0


def _refused(proc, *needles):
    err = proc.stderr.decode()
    assert proc.returncode == 2, (proc.returncode, err)
    assert "Traceback" not in err and err.count("\n") == 1, err
    for needle in needles:
        assert needle in err, err


def test_an_unknown_run_is_refused_with_the_stores_runs(cli):
    _refused(cli("analyze", f"{DB}#nosuchrun"), "mlflow.db", "no run named 'nosuchrun'", "'healthy'", "#RUN")


def test_a_damaged_or_foreign_db_and_an_empty_store_are_refused_naming_the_file_and_the_next_step(cli, tmp_path):
    torn = tmp_path / "mlflow.db"
    torn.write_bytes(DB.read_bytes()[:2048])  # a copy cut short: the header and a little of the schema
    _refused(cli("analyze", torn), str(torn), "tracking URI")
    garbage = tmp_path / "other" / "mlflow.db"
    garbage.parent.mkdir()
    garbage.write_bytes(b"not a database at all\n" * 100)
    _refused(cli("analyze", garbage), str(garbage), "tracking URI")
    foreign = tmp_path / "cache.sqlite"
    with sqlite3.connect(foreign) as db:
        db.execute("CREATE TABLE items (key TEXT)")
    _refused(cli("analyze", foreign), "cache.sqlite")
    empty_db = tmp_path / "empty" / "mlflow.db"
    empty_db.parent.mkdir()
    shutil.copy(DB, empty_db)
    with sqlite3.connect(empty_db) as db:  # MLflow's schema, every run deleted: a store nothing was logged to
        for table in ("metrics", "latest_metrics", "params", "tags", "runs"):
            db.execute(f"DELETE FROM {table}")
    _refused(cli("analyze", empty_db), str(empty_db), "no runs", "tracking URI")
    empty_store = tmp_path / "mlruns"
    (empty_store / "0").mkdir(parents=True)
    shutil.copy(MLRUNS / "0" / "meta.yaml", empty_store / "0" / "meta.yaml")  # mlflow's Default experiment
    _refused(cli("analyze", empty_store), "mlruns", "no runs", "tracking URI")


def test_a_store_among_a_runs_other_logs_is_read_with_them(tmp_path):
    out = tmp_path / "output"
    shutil.copytree(MLRUNS, out / "mlruns")
    (out / "train.log").write_text("loading the model\n{'loss': 2.61, 'grad_norm': 1.2, 'learning_rate': 2e-06, "
                                   "'epoch': 0.07}\n")
    d = analyze([out])
    used = " ".join(d.gathering.used)
    assert "(mlflow)" in used and "train.log" in used and len(d.gathering.used) == 2
    assert not any("metrics" in why for why in d.gathering.skipped)  # a run's own files are not logs
    assert any(f.code == "EVAL001" for f in d.findings)


def test_a_selector_on_a_file_that_is_not_an_mlflow_store_is_refused(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("{'loss': 2.3, 'epoch': 0.1}\n")
    with pytest.raises(SourceError, match="MLflow SQLite store only"):
        analyze([f"{log}#run"])


def _db_run_id(name: str) -> str:
    with sqlite3.connect(f"{DB.resolve().as_uri()}?mode=ro", uri=True) as db:
        return db.execute("SELECT run_uuid FROM runs WHERE name = ?", (name,)).fetchone()[0]
