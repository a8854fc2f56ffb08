"""The live guard's events dir beside a run's own log read alone (its stdout, trainer_state.json,
metrics.csv): which steps the guard recovered, taken from that dir only when it is this run's (its losses are
the log's at the same steps)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from lossguard.core.records import TRAIN, Record

if TYPE_CHECKING:
    from lossguard.sources.gather import Gathering


def read_recoveries(files: list[Path], gathering: Gathering) -> None:
    """A run's own log read alone (its stdout, trainer_state.json, metrics.csv) does not say which steps the
    live guard recovered; the guard's events dir beside it does. Looked for in the log's folder and its
    folders, else the folder above and its folders, else the one above that (Lightning's
    RUN/csv/version_0/metrics.csv beside RUN/events); used only when exactly one such dir is found at the
    nearest level that has any, and only once its losses match the log's (`tied`): another run's events must
    not speak for this one. Only its `recovery` lines, its first step and its first losses are read: the log's
    own numbers stay the analysis."""
    dirs: set[Path] = set()
    for level in range(3):  # the nearest level that has any wins (a neighbouring run's dir is further off)
        for path in files:
            parents = path.resolve().parents
            if level >= len(parents):
                continue
            base = parents[level]
            dirs.update(d for d in (base, *_subdirs(base)) if any(d.glob("events-rank*.jsonl")))
        if dirs:
            break
    if len(dirs) != 1:
        if dirs:
            gathering.notes.append("several lossguard events dirs beside the log (" + ", ".join(map(str, sorted(dirs)))
                                   + "): none was read for its recoveries; pass the run's own with the log")
        return
    (events,) = dirs
    from lossguard.sources.lossguard_events import committed_losses, recoveries_in

    files = sorted(events.glob("events-rank*.jsonl"))
    found, gathering.events_first_step = recoveries_in(files)
    if found:
        gathering.recoveries.extend(found)
        gathering.events_losses, gathering.events_dir = committed_losses(files), str(events)
        gathering.used.append(f"{events} (the live guard's recovery lines)")


def _subdirs(folder: Path) -> list[Path]:
    try:
        return [p for p in folder.iterdir() if p.is_dir()]
    except OSError:
        return []


# The log's first training records compared with the events dir found beside it, and how close a loss must
# be to count as the same (a log prints 4 decimals, or 4 significant digits).
_TIE_RECORDS, _TIE_REL, _TIE_ABS = 40, 1e-3, 6e-5


def tied(records: Iterable[Record], gathering: Gathering) -> Iterator[Record]:
    """The log's records, unchanged; on the way, its first training losses are compared with the events
    dir's at the same steps: rank 0's, the ranks' mean (what the Trainer logs), or that mean over the steps
    since the log's previous record (a Trainer logging every N steps). Unless most of those that share a
    step agree (and at least one does), the dir is another run's: its recoveries are dropped before any
    record is judged, and the report says why."""
    losses, held, compared, agreed, offset, previous = gathering.events_losses, [], 0, 0, None, None
    records = iter(records)
    for record in records:
        held.append(record)
        loss = record.signals.get("loss") if record.kind == TRAIN else None
        if loss is None or record.step is None:
            continue
        offset = shift(record.step, gathering) if offset is None else offset
        step = record.step + offset
        if step in losses:
            compared += 1
            agreed += any(math.isclose(loss, theirs, rel_tol=_TIE_REL, abs_tol=_TIE_ABS)
                          for theirs in _as_logged(losses, step, previous))
        previous = step
        if sum(r.kind == TRAIN for r in held) >= _TIE_RECORDS:
            break
    if not (agreed and 2 * agreed > compared):
        gathering.recoveries.clear()
        gathering.used = [u for u in gathering.used if not u.startswith(gathering.events_dir + " ")]
        gathering.notes.append(f"{gathering.events_dir}: a lossguard events dir beside the log, of another run "
                               f"(its losses match the log's at {agreed} of {compared} shared steps): not read")
    yield from held
    yield from records


def _as_logged(losses: dict[int, list[float]], step: int, previous: int | None) -> list[float]:
    """What a log may show for `step` from the events' per-rank losses: rank 0's, the ranks' mean, and the
    mean of the ranks' means over the steps since the log's previous record."""
    first = previous + 1 if previous is not None and previous < step else step
    means = {s: sum(v) / len(v) for s in range(first, step + 1) if (v := losses.get(s))}
    here = losses[step]
    return [here[0], means[step], sum(means.values()) / len(means)]


def shift(first_step: int, gathering: Gathering | None) -> int:
    """1 when the log numbers from 0 where the guard's events (read beside it) number the same steps from 1:
    Lightning's metrics.csv logs its first optimizer step as step 0; else 0."""
    return 1 if gathering is not None and first_step == 0 and gathering.events_first_step == 1 else 0
