"""W&B runs: the transaction log `run-<id>.wandb` of an offline (or online) run directory, read through the
`wandb` package's own reader (no hand-written decoder of its record format).

wandb 0.31 reads a transaction log with its `wandb-core` binary (`wandb leet inspect --json`: one JSON
object per record); it is run directly, without importing wandb (an import costs seconds). History records
carry `_step` (W&B's own counter: one per `wandb.log` call) and the logged keys, NaN and +-Inf written
"NaN" / "Infinity" / "-Infinity". The HF Trainer's WandbCallback logs `train/loss`, `train/grad_norm`, ...
with `train/global_step`, the Trainer's step: a history row's step is that key when the row has it,
else `_step`. The run's config (the Trainer's arguments) gives the run facts.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

from lossguard.core.records import Record
from lossguard.sources.base import SourceError
from lossguard.sources.tracker_rows import facts_record, number, step_records
from lossguard.sources.vocabulary import column_name

MAGIC = b":W&B"
# A run directory's name: `offline-run-20240501_101500-abc123` (`run-...` when it was synced online).
_STARTED = re.compile(r"(\d{8}_\d{6})-[^/]*$")


class WandbOfflineSource:
    name = "wandb"

    def sniff(self, path: Path, head: bytes) -> bool:
        return head.startswith(MAGIC)

    def parse(self, path: Path) -> Iterator[Record]:
        source = f"wandb run {_run_id(path)}"
        config: dict = {}
        told: dict = {}  # the config the facts were last made from
        got_any = False
        for record in _log_records(path):
            got_any = True
            kind = record.get("type")
            if kind in ("run", "config"):
                config.update(_config_items(record.get(kind) or {}))
            elif kind == "history":
                if config != told:  # the facts before the numbers, as a log's config dump comes first
                    told = dict(config)
                    yield from _facts(config, source)
                item = (record.get("history") or {}).get("item") or {}
                values = {k: v for k, v in ((k, number(v)) for k, v in item.items()) if v is not None}
                yield from step_records(_step(values), values, source)
        if not got_any:
            raise SourceError(f"{path}: no record in this W&B transaction log; pass the run-<id>.wandb of a run "
                              "that logged (wandb/offline-run-*/)")
        if config != told:  # config set after the last log
            yield from _facts(config, source)


def _facts(config: dict, source: str) -> list[Record]:
    facts = facts_record(config, f"{source} config")
    return [] if facts is None else [facts]


def runs_under(root: Path) -> list[Path]:
    """The transaction logs of the W&B runs under `root`, oldest first (by the start time in the run
    directory's name, then by the log's last write); `wandb/latest-run` is a link to one of them."""
    logs: dict[Path, Path] = {}
    for log in sorted(root.rglob("run-*.wandb"), key=lambda p: p.parent.is_symlink()):
        if log.is_file():
            logs.setdefault(log.resolve(), log)  # the run directory's own path before a link's

    def started(log: Path) -> tuple[str, float]:
        match = _STARTED.search(log.parent.name)
        return (match.group(1) if match else "", log.stat().st_mtime)

    return sorted(logs.values(), key=started)


def _step(values: dict[str, float]) -> int:
    for key, value in values.items():
        if column_name(key) == "step" and 0 <= value < 1e15:
            return int(value)
    return int(values.get("_step", 0))


def _config_items(record: dict) -> dict:
    """A run or config record's settings: `{"config": {"update": {key: value}}}` or `{"update": ...}`."""
    update = (record.get("config") or record).get("update") or {}
    return {k: v.get("value", v) if isinstance(v, dict) else v for k, v in update.items()}


def _run_id(path: Path) -> str:
    return path.stem[4:] if path.stem.startswith("run-") else path.stem


def _log_records(path: Path) -> Iterator[dict]:
    """The transaction log's records as wandb-core prints them, one JSON object a line, streamed."""
    command = [_core(path), "leet", "inspect", "--no-observability", "--json", "--run-file", str(path),
               str(path.resolve().parent.parent)]
    # stderr goes to a file: a pipe nobody reads until stdout ends could fill and stall the reader.
    import tempfile  # only a W&B input needs it: every other analysis starts faster without

    with tempfile.TemporaryFile() as errors, \
            subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors, stdin=subprocess.DEVNULL) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                yield record
        proc.wait()
        errors.seek(0)
        error = errors.read().decode("utf-8", "replace").strip()
    if proc.returncode != 0:
        last = error.splitlines()[-1][:300] if error else f"exit status {proc.returncode}"
        raise SourceError(f"{path}: wandb could not read this transaction log ({last}); check it is a whole "
                          "run-<id>.wandb (copy it again once the run has ended), and that wandb is 0.31 or later "
                          "(`pip install -U wandb`)")


def _core(path: Path) -> str:
    """wandb's `wandb-core` binary, found without importing wandb; SourceError naming the extra without it."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("wandb")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        from lossguard.install_hint import install_command

        raise SourceError(f"{path}: reading a W&B run needs the `wandb` package; install it with "
                          f"`{install_command('wandb')}`")
    core = Path(next(iter(spec.submodule_search_locations))) / "bin" / "wandb-core"
    if not core.is_file():
        raise SourceError(f"{path}: this wandb install has no wandb-core binary ({core}); reinstall it with "
                          "`pip install --force-reinstall wandb`")
    return str(core)
