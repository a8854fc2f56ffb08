"""MLflow runs, read from the store's own files and tables with the standard library (mlflow is never imported).

- File store (`mlruns/`): `<experiment_id>/<run_id>/meta.yaml` (run id, name, start time, lifecycle stage),
  `metrics/<key>` files of `timestamp value step` lines (a key with `/` is a nested directory), `params/<key>`.
  A NaN or Inf is written `nan` / `inf` / `-inf`.
- SQLite store (`mlflow.db`, MLflow 3's default): tables `runs`, `metrics` (key, value, timestamp, run_uuid,
  step, is_nan) and `params`. MLflow stores a NaN as value 0 with is_nan = 1 and clamps +-Inf to the largest
  double, +-1.7976931348623157e308 (checked with mlflow 3.17): both are restored here, since a NaN or Inf
  loss is exactly what a diagnosis must see.

The HF Trainer's MLflowCallback logs every number of a log at the Trainer's global step; a store's steps are
the run's steps. A store holds many runs: which one is read is decided at discovery (`sources/trackers.py`).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lossguard.core.records import Record
from lossguard.sources.base import SourceError
from lossguard.sources.tracker_rows import facts_record, step_records

if TYPE_CHECKING:
    import sqlite3

SQLITE_MAGIC = b"SQLite format 3\x00"
_LARGEST = sys.float_info.max  # where MLflow's SQLite store clamps +-Inf
_TABLES = {"runs", "metrics", "params"}
NEXT_STEP = "pass the store the training job logged to (the path in its tracking URI, sqlite:///PATH or file:PATH)"


@dataclass(frozen=True, slots=True)
class Run:
    run_id: str
    name: str
    start_ms: int
    place: Path  # the run's directory (file store) or the store's db

    @property
    def label(self) -> str:
        return f"'{self.name}' (id {self.run_id})"


class MlflowSource:
    """An MLflow run: a file-store run directory, or one run of an SQLite store (`run_id`; None: the latest)."""

    name = "mlflow"

    def __init__(self, run_id: str | None = None) -> None:
        self.run_id = run_id

    def sniff(self, path: Path, head: bytes) -> bool:
        if not head.startswith(SQLITE_MAGIC):
            return _named_like_a_store(path)  # so that a damaged mlflow.db gets MLflow's message, not a generic one
        import sqlite3  # only an SQLite file needs it: every other analysis starts faster without

        try:
            return _tables(path) >= _TABLES
        except sqlite3.DatabaseError:
            return _named_like_a_store(path)

    def parse(self, path: Path) -> Iterator[Record]:
        if path.is_dir():
            return _read_run_dir(path)
        return _read_db(path, self.run_id)


# -- file store ------------------------------------------------------------------------------------------
def runs_under(root: Path) -> list[Run]:
    """The live runs of the file stores under `root` (`root` may be a run directory itself), oldest first."""
    runs = []
    for meta in root.rglob("meta.yaml"):
        if ".trash" in meta.parts or not (meta.parent / "metrics").is_dir():
            continue
        fields = _meta_fields(meta)
        run_id = fields.get("run_id") or fields.get("run_uuid")
        if not run_id or fields.get("lifecycle_stage") == "deleted":
            continue
        name = fields.get("run_name") or _read_text(meta.parent / "tags" / "mlflow.runName") or run_id
        runs.append(Run(run_id, name, _int(fields.get("start_time")), meta.parent))
    return sorted(runs, key=lambda r: (r.start_ms, r.run_id))


def holds_experiments(root: Path) -> bool:
    """`root` is a file store (or one of its experiments) that holds no run: an experiment's meta.yaml."""
    metas = [root / "meta.yaml", *root.glob("*/meta.yaml")]
    return any(m.is_file() and "artifact_location" in _meta_fields(m) for m in metas)


def _read_run_dir(run_dir: Path) -> Iterator[Record]:
    fields = _meta_fields(run_dir / "meta.yaml")
    name = fields.get("run_name") or _read_text(run_dir / "tags" / "mlflow.runName") or run_dir.name
    by_step: dict[int, dict[str, float]] = {}
    metrics = run_dir / "metrics"
    for file in sorted(metrics.rglob("*")):
        if file.is_file():
            key = file.relative_to(metrics).as_posix()
            for step, value in _metric_lines(file):
                by_step.setdefault(step, {})[key] = value
    params_dir = run_dir / "params"
    params = {f.relative_to(params_dir).as_posix(): _read_text(f) for f in params_dir.rglob("*") if f.is_file()}
    yield from _records(name, by_step, params)


def _metric_lines(file: Path) -> Iterator[tuple[int, float]]:
    """(step, value) of a metric file's `timestamp value step` lines (MLflow before 1.0 wrote no step: 0)."""
    for line in _read_text(file).splitlines():
        parts = line.split()
        try:
            yield (int(parts[2]) if len(parts) > 2 else 0), float(parts[1])
        except (ValueError, IndexError):
            continue  # a line torn by a live run's write


def _meta_fields(meta: Path) -> dict[str, str]:
    """The top-level `key: value` lines of an MLflow meta.yaml (flat; quotes stripped)."""
    fields = {}
    for line in _read_text(meta).splitlines():
        key, sep, value = line.partition(":")
        if sep and key and not key[0].isspace():
            fields[key.strip()] = value.strip().strip("'\"")
    return fields


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _int(text: str | None) -> int:
    try:
        return int(text or 0)
    except ValueError:
        return 0


# -- SQLite store ----------------------------------------------------------------------------------------
def db_runs(path: Path) -> list[Run]:
    """The live runs of an SQLite store, oldest first; SourceError when it is not a readable MLflow store."""
    with _connected(path) as db:
        rows = db.execute("SELECT run_uuid, name, start_time FROM runs WHERE lifecycle_stage IS NULL "
                          "OR lifecycle_stage != 'deleted' ORDER BY start_time, run_uuid").fetchall()
    return [Run(run_id, name or run_id, start or 0, path) for run_id, name, start in rows]


def choose(runs: list[Run], selector: str | None, store: Path) -> Run:
    """The run a selector (a run id, a unique id prefix or a run name) names; None: the latest started."""
    if not runs:
        raise SourceError(f"{store}: an MLflow store with no runs; {NEXT_STEP}")
    if selector is None:
        return runs[-1]
    exact = [r for r in runs if selector in (r.run_id, r.name)]
    prefixed = [r for r in runs if r.run_id.startswith(selector)]
    matches = exact or (prefixed if len(prefixed) == 1 else [])
    if not matches:
        listed = ", ".join(r.label for r in runs[-10:])
        why = "more than one run whose id starts with" if prefixed else "no run named"
        raise SourceError(f"{store}: {why} '{selector}' in this store (its runs: {listed}); "
                          f"pass {store}#RUN with a run's full id or name")
    return matches[-1]  # a name given to several runs: its latest


def _read_db(path: Path, run_id: str | None) -> Iterator[Record]:
    run = choose(db_runs(path), run_id, path)
    by_step: dict[int, dict[str, float]] = {}
    with _connected(path) as db:
        rows = db.execute("SELECT key, value, step, is_nan FROM metrics WHERE run_uuid = ? "
                          "ORDER BY step, timestamp", (run.run_id,))
        for key, value, step, is_nan in rows:
            by_step.setdefault(int(step), {})[key] = _restored(value, is_nan)
        params = dict(db.execute("SELECT key, value FROM params WHERE run_uuid = ?", (run.run_id,)).fetchall())
    yield from _records(run.name, by_step, params)


def _restored(value: float, is_nan: int) -> float:
    if is_nan:
        return math.nan
    if value >= _LARGEST:
        return math.inf
    return -math.inf if value <= -_LARGEST else value


class _connected:
    """A read-only connection (never a journal or lock file beside the user's store); any SQLite failure,
    on opening or on a damaged page read later, becomes one SourceError naming the file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.db: sqlite3.Connection | None = None

    def __enter__(self) -> sqlite3.Connection:
        import sqlite3

        try:
            self.db = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True)
            tables = _table_names(self.db)
        except sqlite3.DatabaseError as exc:
            self._close()
            raise self._unreadable(exc) from None
        if not tables >= _TABLES:
            self._close()
            raise SourceError(f"{self.path}: an SQLite database without MLflow's runs, metrics and params tables; "
                              f"{NEXT_STEP}")
        return self.db

    def __exit__(self, kind, exc, tb) -> None:
        import sqlite3

        self._close()
        if isinstance(exc, sqlite3.DatabaseError):
            raise self._unreadable(exc) from None

    def _close(self) -> None:
        if self.db is not None:
            self.db.close()
            self.db = None

    def _unreadable(self, exc: sqlite3.DatabaseError) -> SourceError:
        return SourceError(f"{self.path}: not a readable MLflow SQLite store (sqlite: {exc}); copy it again whole "
                           f"from where MLflow wrote it, or {NEXT_STEP}")


def _tables(path: Path) -> set[str]:
    import sqlite3

    db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return _table_names(db)
    finally:
        db.close()


def _table_names(db: sqlite3.Connection) -> set[str]:
    return {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def _named_like_a_store(path: Path) -> bool:
    return path.suffix == ".db" and "mlflow" in path.name.lower()


# -- both stores -----------------------------------------------------------------------------------------
def _records(name: str, by_step: dict[int, dict[str, float]], params: dict[str, str]) -> Iterator[Record]:
    source = f"mlflow run {name}"
    facts = facts_record(params, f"{source} params")
    if facts is not None:
        yield facts
    for step in sorted(by_step):
        yield from step_records(step, by_step[step], source)
