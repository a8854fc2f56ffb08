"""Make tests/fixtures/trackers/: small runs written by the real MLflow and W&B libraries.

Each library gets the same three HF-Trainer-like runs, logged the way transformers' MLflowCallback and
WandbCallback log them (same keys, same step handling, the Trainer's arguments as params / config):

- `healthy`: the loss falls, the evaluation loss falls with it;
- `nan`: the loss goes NaN at step 30 (its gradient norm overflows to inf); after it the Trainer's NaN filter
  logs loss 0.0 with grad_norm nan;
- `overfit`: the training loss keeps falling while the evaluation loss turns and climbs.

Written, in this order (so `overfit` is the most recently started run of each store):
- `mlruns/`: MLflow's file store (`MLFLOW_ALLOW_FILE_STORE=true`: MLflow 3 keeps it in maintenance mode);
- `mlflow.db`: MLflow's SQLite store (vacuumed into 512-byte pages: most of its size is MLflow's empty schema);
- `wandb/offline-run-*/run-<id>.wandb`: W&B offline runs (WANDB_MODE=offline); only the transaction log is
  kept (the run's debug logs and requirements.txt hold this machine's paths and packages).

Rerun (made with mlflow 3.17.2 and wandb 0.31.0 on Python 3.11; mlflow is never a lossguard dependency):

    python3 -m venv /tmp/mlvenv && /tmp/mlvenv/bin/pip install 'mlflow==3.17.2' 'wandb==0.31.0'
    /tmp/mlvenv/bin/python scripts/make_tracker_runs.py

The tests (tests/unit/test_mlflow_source.py, test_wandb_source.py) find MLflow runs by name and W&B runs by
their order, never by id, so new fixtures need no test edits.
"""

from __future__ import annotations

import math
import os
import random
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "trackers"
LOGGING_STEPS, EVAL_STEPS = 2, 10
STEPS = {"healthy": 60, "nan": 60, "overfit": 80}
# The Trainer's arguments as its callbacks log them (a subset: what lossguard may read as a fact).
ARGS = {"learning_rate": 2e-5, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 2,
        "fp16": False, "bf16": True, "gradient_checkpointing": True, "deepspeed": "ds_zero2.json",
        "logging_steps": LOGGING_STEPS, "eval_steps": EVAL_STEPS, "logging_nan_inf_filter": True,
        "transformers_version": "4.57.1", "model_type": "llama"}
SUMMARY_KEYS = ("train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss", "total_flos")


def logs(kind: str) -> list[tuple[int, dict]]:
    """The Trainer's `on_log` calls of a run: (global_step, logs), train logs, evaluations and the summary."""
    rng = random.Random(kind)
    total = STEPS[kind]
    out, losses = [], []
    for step in range(LOGGING_STEPS, total + 1, LOGGING_STEPS):
        epoch = round(step / total * 2, 4)
        lr = 2e-5 * min(1.0, step / 10) * (1 - step / (total + 1))
        loss = 2.6 * math.exp(-step / (40 if kind == "overfit" else 70)) + 0.3 + rng.uniform(-0.04, 0.04)
        grad_norm = 1.2 + rng.uniform(-0.2, 0.2)
        if kind == "nan" and step >= 30:
            # The Trainer's NaN filter: the NaN step's own log shows it, later logs show 0.0 (the filtered
            # losses are dropped from the running sum) while the clipped-norm computation keeps saying nan.
            loss, grad_norm = (math.nan, math.inf) if step == 30 else (0.0, math.nan)
        losses.append(loss)
        out.append((step, {"loss": round(loss, 4), "grad_norm": grad_norm, "learning_rate": lr, "epoch": epoch}))
        if step % EVAL_STEPS == 0:
            out.append((step, {"eval_loss": _eval_loss(kind, step), "eval_runtime": 0.41,
                               "eval_samples_per_second": 97.5, "eval_steps_per_second": 12.2, "epoch": epoch}))
    finite = [x for x in losses if math.isfinite(x)]
    out.append((total, {"train_runtime": 31.7, "train_samples_per_second": 15.1, "train_steps_per_second": 1.9,
                        "total_flos": 1.2e13, "train_loss": sum(finite) / len(finite), "epoch": 2.0}))
    return out


def _eval_loss(kind: str, step: int) -> float:
    if kind == "nan":
        return 2.1 if step < 30 else math.nan  # the weights are NaN after step 30
    if kind == "overfit":
        return [2.2, 1.9, 1.85, 2.2, 2.6, 2.9, 3.2, 3.5][step // EVAL_STEPS - 1]
    return round(2.4 - step / 100, 4)


def write_mlflow(uri: str) -> None:
    import mlflow

    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment("lossguard-fixtures")
    for kind in STEPS:
        with mlflow.start_run(run_name=kind):
            mlflow.log_params({k: v for k, v in ARGS.items()})  # MLflowCallback.setup: args and model config
            for step, entry in logs(kind):  # MLflowCallback.on_log: every number, at the global step
                mlflow.log_metrics(entry, step=step)
        time.sleep(0.05)  # distinct start times


def write_wandb(root: Path) -> None:
    import wandb

    settings = wandb.Settings(mode="offline", silent=True, console="off", save_code=False, disable_git=True,
                              x_disable_stats=True, x_disable_meta=True, x_disable_machine_info=True,
                              x_save_requirements=False)
    for kind in STEPS:
        run = wandb.init(project="lossguard-fixtures", name=kind, dir=str(root), config=ARGS, settings=settings)
        # WandbCallback.setup: every metric is plotted against the Trainer's global step.
        run.define_metric("train/global_step")
        run.define_metric("*", step_metric="train/global_step", step_sync=True)
        for step, entry in logs(kind):  # WandbCallback.on_log
            for key in SUMMARY_KEYS:
                if key in entry:
                    run.summary[key] = entry[key]
            rest = {k: v for k, v in entry.items() if k not in SUMMARY_KEYS}
            run.log({**_rewrite_logs(rest), "train/global_step": step})
        run.finish()
        time.sleep(1.1)  # offline-run-YYYYMMDD_HHMMSS-<id>: one second apart, so the names order the runs


def _rewrite_logs(entry: dict) -> dict:
    """transformers.integrations.integration_utils.rewrite_logs: eval_x -> eval/x, x -> train/x."""
    return {("eval/" + k[5:] if k.startswith("eval_") else "train/" + k): v for k, v in entry.items()}


def main() -> None:
    os.environ.update(MLFLOW_ALLOW_FILE_STORE="true", WANDB_MODE="offline", WANDB_SILENT="true")
    with tempfile.TemporaryDirectory(prefix="trackers-") as tmp:
        work = Path(tmp)
        os.chdir(work)
        write_mlflow("file:./mlruns")
        write_mlflow("sqlite:///mlflow.db")
        db = sqlite3.connect(work / "mlflow.db")
        # MLflow's schema is some 200 tables and indexes of one page each: 512-byte pages (SQLite's smallest)
        # make the store a tenth of its 4 KB-page size; the schema and rows are MLflow's, unchanged.
        db.execute("PRAGMA page_size = 512")
        db.execute("VACUUM")
        db.close()
        write_wandb(work)
        for path in (work / "wandb").iterdir():  # keep each run's transaction log only
            if path.is_symlink() or path.is_file():
                path.unlink()
            else:
                for item in path.iterdir():
                    if item.suffix != ".wandb":
                        shutil.rmtree(item) if item.is_dir() else item.unlink()
        shutil.rmtree(OUT, ignore_errors=True)
        OUT.mkdir(parents=True)
        for name in ("mlruns", "mlflow.db", "wandb"):
            (shutil.copytree if (work / name).is_dir() else shutil.copy2)(work / name, OUT / name)
    size = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    print(f"wrote {OUT} ({size >> 10} KB)")


if __name__ == "__main__":
    main()
