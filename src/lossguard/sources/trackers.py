"""Experiment-tracker stores among the inputs: which run of a store is read, and which files are that run's.

A store holds many runs (`mlruns/`, `mlflow.db`, `wandb/`); a diagnosis is of one run: the most recently
started one, named in a note (the CLI prints it on stderr) with how to read another: its run directory
(`mlruns/<experiment>/<run_id>`, `wandb/offline-run-...`), or `mlflow.db#RUN` (a run id, id prefix or
name) for the SQLite store, whose runs have no path of their own. A run's own files (MLflow's metric files
and artifacts, W&B's debug logs) are read through its reader only, never as logs of their own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from lossguard.sources import mlflow_store as mlflow
from lossguard.sources.base import Source, SourceError
from lossguard.sources.mlflow_store import MlflowSource
from lossguard.sources.registry import Input
from lossguard.sources.wandb_offline import WandbOfflineSource, runs_under

if TYPE_CHECKING:
    from lossguard.sources.gather import Gathering

SELECTOR = "#"


@dataclass
class TrackerRuns:
    """The tracker runs of a directory: the inputs to read and the directories whose files they own."""

    inputs: list[Input] = field(default_factory=list)
    owned: set[Path] = field(default_factory=set)  # resolved run directories
    empty_store: str | None = None  # a store with no run: what to say when nothing else is found

    def owns(self, path: Path) -> bool:
        return bool(self.owned) and not self.owned.isdisjoint(path.resolve().parents)


def split_selector(text: str) -> tuple[str, str | None]:
    """`mlflow.db#RUN` -> ("mlflow.db", "RUN") when no file is named so and the part before `#` exists."""
    path, sep, run = text.rpartition(SELECTOR)
    if not sep or not run or Path(text).exists() or not Path(path).is_file():
        return text, None
    return path, run


def bind(path: Path, source: Source, selector: str | None, gathering: Gathering, label: str) -> Source:
    """An SQLite store's source bound to the run it reads (the selected, else the latest started)."""
    if not isinstance(source, MlflowSource):
        if selector is not None:
            raise SourceError(f"{label}: `{SELECTOR}RUN` selects a run of an MLflow SQLite store only; "
                              f"{path} is read as {source.name}")
        return source
    runs = mlflow.db_runs(path)
    run = mlflow.choose(runs, selector, path)
    if selector is None and len(runs) > 1:
        _note(gathering, f"{path} holds {len(runs)} MLflow runs; reading the latest started, {run.label}; to read "
                         f"another, pass {path}{SELECTOR}RUN (a run id or name)", runs, run)
    return MlflowSource(run.run_id)


def runs_in(root: Path, gathering: Gathering) -> TrackerRuns:
    """The latest MLflow file-store run and the latest W&B run under the directory `root`."""
    found = TrackerRuns()
    runs = mlflow.runs_under(root)
    if runs:
        run = runs[-1]
        found.inputs.append(Input(run.place, MlflowSource()))
        if len(runs) > 1:
            _note(gathering, f"{root} holds {len(runs)} MLflow runs; reading the latest started, {run.label}; to read "
                             f"another, pass its run directory ({run.place.parent}/<run_id>)", runs, run)
        found.owned.update(r.place.resolve() for r in runs)
    elif mlflow.holds_experiments(root):
        found.empty_store = f"{root}: an MLflow store with no runs; {mlflow.NEXT_STEP}"
    logs = runs_under(root)
    if logs:
        latest = logs[-1]
        found.inputs.append(Input(latest, WandbOfflineSource()))
        if len(logs) > 1:
            gathering.notes.append(f"{root} holds {len(logs)} W&B runs; reading the latest started, "
                                   f"{latest.parent.name}; to read another, pass its run directory")
            gathering.skipped.extend(f"{log.parent}: another W&B run, not read" for log in logs[:-1])
        found.owned.update(log.parent.resolve() for log in logs)
    for item in found.inputs:
        gathering.used.append(f"{item.path} ({item.source.name})")
    return found


def _note(gathering: Gathering, note: str, runs: list[mlflow.Run], chosen: mlflow.Run) -> None:
    gathering.notes.append(note)
    gathering.skipped.extend(f"{r.place}: another MLflow run, {r.label}, not read" for r in runs if r is not chosen)
