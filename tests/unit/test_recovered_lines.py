"""The guard's recovered lines in a job's output: read back as the step the guard recovered (the report's
`recoveries`), and that step's logged attempt left out, by `analyze` and by `watch` alike. The lines are
made by the guard's own code (monitor/recover.py, replay.py), so a change of wording fails here."""

from __future__ import annotations

import pytest

from lossguard.api import analyze
from lossguard.core.findings import Severity
from lossguard.monitor.options import RecoverOptions
from lossguard.monitor.recover import Gate, Hold
from lossguard.sources.readers import guard_lines
from lossguard.watch.analyzer import LiveAnalyzer

torch = pytest.importorskip("torch")  # monitor/replay.py imports it

NAN = [{"fault": "non-finite loss", "ranks": [1], "values": {1: float("nan")}}]
# The real Trainer stdout of a two-rank ZeRO-2 run whose rank 1 lost step 4 to a NaN the guard replayed
# (tests/integration/live_jobs/hf_recover_job.py z2-transient): the NaN filter logged half the loss there.
LOGGED = ["4.445", "4.395", "4.35", "2.165", "4.289", "4.277", "4.264", "4.253"]


def _dicts(losses: list[str]) -> list[str]:
    return [f"{{'loss': '{loss}', 'grad_norm': '0.9', 'learning_rate': '0.0005', 'epoch': '{i / 32:.4g}'}}"
            for i, loss in enumerate(losses, 1)]


def _line(kind: str) -> str:
    from lossguard.monitor import replay

    hold = Hold(4, NAN, used=1)
    if kind == "held":
        return Gate(RecoverOptions()).console_line(hold)
    named = [{"rank": 1, "position": 2, "hash": "1d73e8291084cd4e", "index": 13}]
    return replay.console_line(hold, kind, named if kind in ("sample", "masked") else [], RecoverOptions())


@pytest.mark.parametrize(("kind", "read_as", "lost"), [("held", "held", 1), ("transient", "transient", 0),
                                                        ("sample", "sample", 0), ("masked", "sample", 1),
                                                        ("jump", "held", 1)])
def test_every_recovered_line_the_guard_prints_reads_back_as_its_recovery(kind, read_as, lost):
    fields = guard_lines.read(_line(kind).encode())
    data = fields.data
    assert (fields.event, fields.step, data["kind"], data["steps_lost"]) == ("recovery", 4, read_as, lost)
    assert (data["ranks"], data["code"], data["signature"]) == ([1], "LOSS001", "nonfinite")
    if kind in ("sample", "masked"):
        assert [(s["rank"], s["hash"], s["index"]) for s in data["samples"]] == [(1, "1d73e8291084cd4e", 13)]


def test_the_budget_halt_is_not_read_as_a_recovery():
    line = Gate(RecoverOptions()).console_line(Hold(4, NAN, give_up=True, used=3))
    assert guard_lines.read(line.encode()).event == "guard-halt"


def _write(tmp_path, lines: list[str]):
    path = tmp_path / "train.log"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_analyze_leaves_the_recovered_steps_attempt_out_and_says_the_run_was_recovered(tmp_path):
    log = _dicts(LOGGED)
    log.insert(3, _line("transient"))  # the guard says it inside the step, before the Trainer logs it
    diagnosis = analyze([str(_write(tmp_path, log))])
    assert diagnosis.verdict == "warning" and diagnosis.signature is None
    assert [(r["step"], r["kind"]) for r in diagnosis.recoveries] == [(4, "transient")]
    assert diagnosis.result.stats.num_train == 7
    assert [f.code for f in diagnosis.findings] == ["REC001"]


def test_the_healthy_twin_a_log_without_a_recovered_line_is_read_whole(tmp_path):
    diagnosis = analyze([str(_write(tmp_path, _dicts(["4.445", "4.395", "4.35", "4.324", "4.289", "4.277",
                                                       "4.264", "4.253"])))])
    assert diagnosis.verdict == "healthy" and diagnosis.recoveries == [] and diagnosis.result.stats.num_train == 8


def test_watch_reads_the_recovered_line_in_the_stream_as_analyze_does():
    live = LiveAnalyzer(halt_on="broken")
    log = _dicts(LOGGED)
    log.insert(3, _line("transient"))
    for line in log:  # a line at a time, as the output streams
        assert live.feed((line + "\n").encode()) == []
    diagnosis = live.finish(inputs=["<watch>"])
    assert diagnosis.verdict == "warning" and [r["step"] for r in diagnosis.recoveries] == [4]
    assert diagnosis.result.stats.num_train == 7


def test_a_lone_log_takes_the_recovered_steps_from_the_events_dir_beside_it(tmp_path):
    import json

    events = tmp_path / "events"
    events.mkdir()
    header = {"type": "header", "format": "lossguard-events", "version": 1, "rank": 0}
    recovery = {"type": "recovery", "step": 4, "ranks": [1], "kind": "transient", "samples": [], "steps_lost": 0,
                "signature": "nonfinite", "code": "LOSS001", "action": "replayed"}
    (events / "events-rank0.jsonl").write_text("".join(json.dumps(x, separators=(",", ":")) + "\n"
                                                       for x in (header, *_committed(LOGGED, 4), recovery)))
    diagnosis = analyze([str(_write(tmp_path, _dicts(LOGGED)))])
    assert diagnosis.verdict == "warning" and [r["step"] for r in diagnosis.recoveries] == [4]
    assert diagnosis.result.stats.num_train == 7
    (events / "events-rank0.jsonl").write_text(json.dumps(header, separators=(",", ":")) + "\n")  # the twin
    assert analyze([str(_write(tmp_path, _dicts(LOGGED[:3] + ["4.324"] + LOGGED[4:])))]).verdict == "healthy"


def _committed(losses: list[str], held: int, offset: float = 0.0) -> list[dict]:
    """The guard's rank-0 training records of the steps it committed (a held step has none)."""
    return [{"type": "record", "kind": "train", "step": step, "rank": 0,
             "signals": {"loss": float(loss) + offset, "grad_norm": 0.9}, "data": {}}
            for step, loss in enumerate(losses, 1) if step != held]


def test_another_runs_events_dir_beside_a_lone_log_is_not_read(tmp_path):
    """Two runs' outputs in one folder: the events dir of a run whose losses are not the log's must not
    speak for it (its recovered step would drop one of this log's records and call a healthy run recovered).
    The report says why it was not read."""
    import json

    events = tmp_path / "other-run-events"
    events.mkdir()
    header = {"type": "header", "format": "lossguard-events", "version": 1, "rank": 0}
    recovery = {"type": "recovery", "step": 4, "ranks": [1], "kind": "transient", "samples": [], "steps_lost": 0,
                "signature": "nonfinite", "code": "LOSS001", "action": "replayed"}
    (events / "events-rank0.jsonl").write_text("".join(json.dumps(x, separators=(",", ":")) + "\n"
                                                       for x in (header, *_committed(LOGGED, 4, 0.37), recovery)))
    healthy = LOGGED[:3] + ["4.324"] + LOGGED[4:]
    diagnosis = analyze([str(_write(tmp_path, _dicts(healthy)))])
    assert diagnosis.verdict == "healthy" and diagnosis.recoveries == [] and diagnosis.result.stats.num_train == 8
    notes = diagnosis.gathering.notes
    assert any("of another run" in note and "other-run-events" in note for note in notes), notes


def test_the_budget_halt_says_what_recurred_and_what_would_quarantine_it():
    gate = Gate(RecoverOptions(budget=2))
    for step in (3, 4):
        gate.event(Hold(step, NAN, used=step - 2))  # held without a replay (the plain Trainer's way)
    line = gate.console_line(Hold(5, NAN, give_up=True, used=2))
    assert "\n" not in line and "recurred at steps 3, 4, 5, on rank(s) 1" in line
    assert "held without a replay" in line and "the Trainer under DeepSpeed" in line
    quarantined = {**gate.event(Hold(4, NAN, used=2)), "kind": "sample", "replay": {"faulted_again": [1]},
                   "samples": [{"rank": 1, "position": 2, "hash": "1d73e8291084cd4e", "index": 13}]}
    gate.note(quarantined)
    line = gate.console_line(Hold(5, NAN, give_up=True, used=2))
    assert "quarantined on the way: hash 1d73e8291084cd4e (index 13)" in line
    assert guard_lines.read(line.encode()).event == "guard-halt"  # still read back as the halt


def test_a_second_rollback_to_the_same_snapshot_counts_only_the_steps_lost_since_the_first():
    from lossguard.monitor.snapshots import steps_lost

    assert steps_lost(7, 5, {}) == 3  # 5, 6 undone, 7 held
    recent = {7: {"kind": "rollback", "step": 7}}
    assert steps_lost(9, 5, recent) == 2  # 8 undone, 9 held: 5-7 were counted at 7
    assert steps_lost(13, 11, recent) == 3  # a newer snapshot: nothing counted twice
    assert steps_lost(9, 5, {7: {"kind": "held", "step": 7, "steps_lost": 1}}) == 4  # 7 counted when held
    assert steps_lost(9, 5, {7: {"kind": "transient", "step": 7, "steps_lost": 0}}) == 5  # 7 was applied


@pytest.mark.parametrize(("value", "flagged"), [("2.165", True), ("0.0", True), ("3.1", False), ("4.3", False)])
def test_the_nan_filters_made_up_loss_read_alone_says_a_step_was_not_applied(tmp_path, value, flagged):
    """Half (two ranks, one NaN) or 0.0 (one rank) between steady losses is what the Trainer's NaN filter
    logs (the half is a real run's); the twins: a real dip (0.72x) and a steady log stay healthy."""
    diagnosis = analyze([str(_write(tmp_path, _dicts(LOGGED[:3] + [value] + LOGGED[4:])))])
    codes = [f.code for f in diagnosis.findings if f.severity >= Severity.WARNING]
    assert (diagnosis.verdict, codes) == (("warning", ["REC002"]) if flagged else ("healthy", []))
    assert diagnosis.recoveries == []  # nothing is known of what was done: not invented
