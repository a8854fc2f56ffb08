"""Hostile, huge and odd input (issue #16), every input built here: how inputs are gathered (a JSON first line,
an output directory, a pipe), the run's own steps on a long log, bounded time and memory per line, and a run
that shows no metric is never healthy. Real parser, real CLI subprocesses."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
import threading
import time

import pytest

from lossguard.api import NothingReadError, analyze
from lossguard.sources import patterns, text_log
from lossguard.sources.readers import generic, log_dict
from lossguard.sources.scan import MAX_LINE
from lossguard.sources.text_log import parse_file
from tests.conftest import ROOT


def _hf_dict(step: int, nan: bool, rng: random.Random) -> str:
    loss = "nan" if nan else f"{2.5 - step * 0.01 + rng.uniform(-0.02, 0.02):.4f}"
    grad = "nan" if nan else f"{rng.uniform(0.8, 1.6):.4f}"
    return f"{{'loss': {loss}, 'grad_norm': {grad}, 'learning_rate': 1e-05, 'epoch': {step / 40:.3f}}}"


def _dicts_going_nan(count: int = 40, nan_from: int = 15) -> list[str]:
    rng = random.Random(count)
    return [_hf_dict(step, step >= nan_from, rng) for step in range(1, count + 1)]


def test_a_json_first_line_does_not_make_the_whole_log_jsonl(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("\n".join([json.dumps({"loss": 2.6, "step": 0}), *_dicts_going_nan()]) + "\n")
    diagnosis = analyze([log])
    assert diagnosis.verdict == "broken" and diagnosis.signature.startswith("nonfinite"), diagnosis.verdict
    assert diagnosis.result.stats.num_train >= 40


def test_a_directory_merges_the_state_file_and_the_stdout_log_on_steps(tmp_path):
    """A checkpoint's 10 healthy steps in trainer_state.json, the whole run (NaN from 15) in train.log."""
    rng = random.Random(0)
    history = [{"loss": 2.5 - s * 0.01, "grad_norm": rng.uniform(0.8, 1.6), "learning_rate": 1e-5,
                "epoch": s / 40, "step": s} for s in range(1, 11)]
    (tmp_path / "trainer_state.json").write_text(json.dumps({"global_step": 10, "log_history": history}))
    (tmp_path / "train.log").write_text("\n".join(_dicts_going_nan()) + "\n")
    (tmp_path / "model.safetensors").write_bytes(b"\x00" * 64)
    diagnosis = analyze([tmp_path])
    assert diagnosis.verdict == "broken" and diagnosis.onset_step == 15
    used = " ".join(diagnosis.gathering.used)
    assert "trainer_state.json" in used and "train.log" in used


def test_a_failure_in_one_source_is_not_outvoted(tmp_path):
    """Both files log steps 1..20; only the stdout log shows step 12 non-finite: the merged step is NaN."""
    rng = random.Random(1)
    history = [{"loss": 2.5 - s * 0.01, "grad_norm": 1.0 + s % 3 * 0.1, "learning_rate": 1e-5, "step": s}
               for s in range(1, 21)]
    (tmp_path / "trainer_state.json").write_text(json.dumps({"global_step": 20, "log_history": history}))
    lines = [_hf_dict(s, s >= 12, rng)[:-1] + f", 'step': {s}}}" for s in range(1, 21)]
    (tmp_path / "train.log").write_text("\n".join(lines) + "\n")
    diagnosis = analyze([tmp_path])
    assert diagnosis.verdict == "broken" and diagnosis.onset_step == 12


def _run_with_fifo(tmp_path, data: bytes) -> subprocess.CompletedProcess:
    fifo = tmp_path / "train.pipe"
    os.mkfifo(fifo)
    writer = threading.Thread(target=fifo.write_bytes, args=(data,))
    writer.start()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, "-m", "lossguard", "analyze", str(fifo), "--format", "json"],
                          capture_output=True, timeout=120, env=env)
    writer.join(timeout=10)
    return proc


def test_a_fifo_given_as_a_path_is_read_once(tmp_path):
    proc = _run_with_fifo(tmp_path, ("\n".join(_dicts_going_nan()) + "\n").encode())
    assert proc.returncode == 1, proc.stderr
    out = json.loads(proc.stdout)
    assert out["verdict"] == "broken" and out["onset_step"] == 15


@pytest.mark.skipif(shutil.which("bash") is None, reason="process substitution needs bash")
def test_process_substitution_is_read(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("\n".join(_dicts_going_nan()) + "\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    command = f'"{sys.executable}" -m lossguard analyze <(cat "{log}") --format json'
    proc = subprocess.run(["bash", "-c", command], capture_output=True, timeout=120, env=env)
    assert proc.returncode == 1, proc.stderr
    assert json.loads(proc.stdout)["onset_step"] == 15


def _deepspeed_and_hf_log(path, last_step: int, nan_from: int) -> None:
    """DeepSpeed `step=` lines every 10 steps, an HF dict after each (no step of its own), NaN from nan_from."""
    rng = random.Random(last_step)
    with open(path, "w") as out:
        for step in range(10, last_step + 1, 10):
            out.write(f"[2026-11-01 10:00:00,000] [INFO] [logging.py:96:log_dist] [Rank 0] step={step}, "
                      "skipped=0, lr=[1e-05], mom=[(0.9, 0.999)]\n")
            out.write(_hf_dict(step, step >= nan_from, rng) + "\n")


def test_the_onset_is_the_runs_step_on_a_long_log(tmp_path):
    log = tmp_path / "train.log"
    _deepspeed_and_hf_log(log, 300_000, 250_000)  # 60k lines
    diagnosis = analyze([log])
    assert diagnosis.verdict == "broken" and diagnosis.onset_step == 250_000
    assert not diagnosis.result.stats.steps_are_ordinal


@pytest.mark.slow
def test_the_onset_is_the_runs_step_on_the_600k_line_log(tmp_path):
    log = tmp_path / "train.log"
    _deepspeed_and_hf_log(log, 3_000_000, 2_500_000)
    diagnosis = analyze([log])
    assert diagnosis.onset_step == 2_500_000 and not diagnosis.result.stats.steps_are_ordinal


def _patterns() -> list[re.Pattern]:
    found = [p for module in (patterns, generic, text_log, log_dict) for p in vars(module).values() if isinstance(p, re.Pattern)]
    found += [p for _, p in patterns.EVENT_PATTERNS]
    return [p for p in found if isinstance(p.pattern, bytes)]


_PREFIXES = [b"", b"step 1 loss ", b"{'loss': ", b"iteration 1/ 10 |", b"Epoch(train) [1][ 1/10] ", b"[rank0]: ",
             b"step=1, skipped=0, lr=[", b"| lr: ", b"must match the size of tensor b", b"tensor("]
_FILLS = [b"a", b" ", b"1", b"a1", b"'", b"=", b"| a", b"a: ", b"1.", b"a: 1 ", b"a=", b"{'a': ", b"/", b"-"]


def _scan_cost(pattern: re.Pattern, size: int) -> float:
    texts = [prefix + fill * (size // len(fill)) for prefix in _PREFIXES for fill in _FILLS]
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for text in texts:
            for _ in pattern.finditer(text):
                pass
        best = min(best, time.perf_counter() - start)
    return best


def test_every_parser_regex_is_linear_on_adversarial_lines():
    """10x longer adversarial lines cost about 10x, not 100x (backtracking): a ratio, not a wall clock."""
    slow = []
    for pattern in _patterns():
        small, big = _scan_cost(pattern, 2000), _scan_cost(pattern, 20000)
        if big > 30 * small + 1e-4:
            slow.append(f"{pattern.pattern[:80]!r}: {small * 1e3:.2f} ms -> {big * 1e3:.2f} ms")
    assert not slow, "superlinear: " + "; ".join(slow)


def test_a_40kb_hostile_line_parses_as_fast_as_healthy_lines_of_the_same_size(tmp_path):
    rng = random.Random(2)
    healthy = [_hf_dict(step, False, rng) for step in range(1, 60)]
    hostile, baseline = tmp_path / "hostile.log", tmp_path / "baseline.log"
    hostile.write_text("\n".join(healthy[:30] + ["step 1 loss " + "a" * 40_000] + healthy[30:]) + "\n")
    filler = healthy * (40_000 // len("\n".join(healthy)) + 1)
    baseline.write_text("\n".join(healthy + filler) + "\n")

    def cost(path) -> float:
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            records = list(parse_file(path))
            best = min(best, time.perf_counter() - start)
        return best, records

    base_cost, _ = cost(baseline)
    hostile_cost, records = cost(hostile)
    assert hostile_cost < 10 * base_cost + 0.05, (hostile_cost, base_cost)
    assert sum(r.signals.get("loss") is not None for r in records) >= 59


def test_a_line_past_the_cut_is_counted_and_the_report_says_incomplete(cli, tmp_path):
    lines = _dicts_going_nan(40, 99)
    lines.insert(20, "{'loss': 2.0, 'note': '" + "x" * (MAX_LINE + 10_000) + "'}")
    log = tmp_path / "train.log"
    log.write_text("\n".join(lines) + "\n")
    proc = cli("analyze", log, "--format", "json")
    out = json.loads(proc.stdout)
    assert out["verdict"] == "warning" and out["incomplete"], out
    assert "line 21" in out["incomplete"][0]
    assert any(f["code"] == "SRC001" for f in out["findings"])


# Started from a small wrapper, not from pytest: a child forked from a process counts the parent's
# resident pages in its peak RSS until it execs, and pytest's grows to hundreds of MB over the suite.
_MEASURE = """
import os, subprocess, sys
proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
_, status, usage = os.wait4(proc.pid, 0)
print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)
"""


def _peak_rss_mb(feed) -> tuple[int, float]:
    """Run `lossguard analyze -` in a grandchild fed by `feed(stdin)`; its own peak RSS from wait4."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen([sys.executable, "-c", _MEASURE, sys.executable, "-m", "lossguard", "analyze", "-"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    try:
        feed(proc.stdin)
        proc.stdin.close()
    except BrokenPipeError:
        pass
    code, maxrss_kb = proc.stdout.read().split()
    proc.wait()
    return int(code), int(maxrss_kb) / 1024


def _newline_free(total: int):
    block = b"a" * (1 << 20)

    def feed(stdin):
        for _ in range(total >> 20):
            stdin.write(block)
    return feed


@pytest.mark.skipif(not hasattr(os, "wait4"), reason="peak RSS of one child needs wait4")
def test_a_10mb_line_and_a_256mb_newline_free_stream_stay_bounded():
    code, line_rss = _peak_rss_mb(lambda stdin: stdin.write(b"step 1 loss " + b"a" * (10 << 20) + b"\n"))
    assert code == 2 and line_rss < 400, line_rss  # 2: no metric line, said so
    code, stream_rss = _peak_rss_mb(_newline_free(256 << 20))
    assert code == 2 and stream_rss < 400, stream_rss
    assert stream_rss < line_rss + 150, (line_rss, stream_rss)  # bounded by the cut, not by the stream


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "wait4"), reason="peak RSS of one child needs wait4")
def test_a_1gb_newline_free_stream_stays_under_400mb():
    code, rss = _peak_rss_mb(_newline_free(1 << 30))
    assert code == 2 and rss < 400, rss


def test_a_run_with_no_metric_line_is_no_training_metrics_seen(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("[2026-11-01 10:00:02,000] [INFO] [logging.py:107:log_dist] [Rank 0] DeepSpeed info: "
                   "version=0.14.0, git-hash=unknown\nLoading checkpoint shards: 100%\nsaving model\n")
    with pytest.raises(NothingReadError, match="no training metrics seen"):
        analyze([log])


def test_a_directory_source_that_cannot_be_read_is_named_and_the_rest_is_analysed(cli, tmp_path):
    (tmp_path / "trainer_state.json").write_text('{"log_history": [{"loss": 0.')  # cut before an entry
    (tmp_path / "train.log").write_text("\n".join(_dicts_going_nan()) + "\n")
    (tmp_path / "blob.dat").write_bytes(bytes(range(32)) * 50)
    out = json.loads(cli("analyze", tmp_path, "--format", "json").stdout)
    assert out["verdict"] == "broken" and out["onset_step"] == 15
    assert len(out["incomplete"]) == 1 and "trainer_state.json" in out["incomplete"][0]
    assert out["inputs"] == [str(tmp_path / "train.log")]
    assert any("blob.dat" in line for line in out["inputs_skipped"])
    human = cli("analyze", tmp_path, env={"COLUMNS": "200"}).stdout.decode()
    assert "read     " + str(tmp_path / "train.log") in human and "not read " in human and "skipped  " in human


def test_numbers_that_do_not_fit_are_values_not_errors(tmp_path):
    huge = "9" * 5000
    state = tmp_path / "trainer_state.json"
    rows = [f'{{"loss": 2.0, "step": {huge}}}', '{"loss": 2.1, "step": 1e999}', '{"loss": 1e999, "step": 3}']
    state.write_text('{"global_step": 1e999, "log_history": [' + ", ".join(rows) + "]}")
    assert analyze([state]).verdict == "broken"  # the infinite loss at step 3
    events = tmp_path / "events-rank0.jsonl"
    events.write_text('{"type":"header","format":"lossguard-events","version":1,"rank":0}\n'
                      f'{{"type":"record","kind":"train","step":{huge},"rank":"x","signals":{{"loss":"a"}}}}\n'
                      '{"type":"record","kind":"odd","step":2,"rank":0,"signals":[1],"data":3}\n'
                      '[1, 2]\n{"type":"record","step":3,"rank":0,"signals":{"loss":"nan"}}\n')
    assert analyze([events]).onset_step == 3


def test_watch_of_a_command_that_prints_no_metric_is_not_called_healthy(cli):
    proc = cli("watch", "--", sys.executable, "-c", "print('loading data'); print('done')")
    err = proc.stderr.decode()
    assert proc.returncode == 0 and "no training metrics seen" in err and "healthy" not in err, err


def test_watch_attach_names_what_the_commands_python_cannot_import(cli, tmp_path):
    """A python without torch: the guard could never attach; said before the job starts, exit 2."""
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    bare = venv / "bin" / "python"
    proc = cli("watch", "--attach", "--", bare, "-c", "print('would train')")
    err = proc.stderr.decode()
    assert proc.returncode == 2 and "torch" in err and "[train]" in err and str(bare) in err, err
    assert b"would train" not in proc.stdout


def _base_install(tmp_path):
    """A python with lossguard and its base dependencies only (no torch / DeepSpeed / transformers)."""
    import importlib

    venv, site = tmp_path / "base", tmp_path / "site"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site.mkdir()
    for name in ("click", "rich", "packaging", "yaml", "markdown_it", "mdurl", "pygments"):
        module = importlib.import_module(name)
        source = os.path.dirname(module.__file__)
        (site / name).symlink_to(source, target_is_directory=True)
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{site}"}
    return venv / "bin" / "python", env


def test_demo_in_a_base_install_names_the_extra_and_exits_2(tmp_path):
    python, env = _base_install(tmp_path)
    proc = subprocess.run([str(python), "-m", "lossguard", "demo"], capture_output=True, timeout=120, env=env)
    err = proc.stderr.decode()
    assert proc.returncode == 2 and "[train]" in err and "torch" in err, err
    assert "Traceback" not in err and err.count("\n") <= 2, err


@pytest.mark.parametrize("grep", [True, False])
def test_the_end_of_an_overlong_line_is_read(tmp_path, monkeypatch, grep):
    """A dict printed after 3 MB of junk on the same line (a dumped tensor, progress redraws): the line is
    read by its two ends, so the NaN at its end is seen, with grep's scan and with the Python one."""
    if not grep:
        monkeypatch.setenv("LOSSGUARD_NO_GREP", "1")
    rng = random.Random(3)
    lines = [_hf_dict(step, False, rng) for step in range(1, 21)]
    lines.append("#" * (3 << 20) + _hf_dict(21, True, rng))
    lines += [_hf_dict(step, True, rng) for step in range(22, 25)]
    log = tmp_path / "train.log"
    log.write_text("\n".join(lines) + "\n")
    diagnosis = analyze([log])
    assert diagnosis.verdict == "broken" and diagnosis.onset_step == 21
    assert diagnosis.incomplete and "line 21" in diagnosis.incomplete[0]


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_live_guard_that_switched_itself_off_makes_the_analysis_incomplete(tmp_path, ranks):
    """Its `internal-error` event is noted from one rank's file and from per-rank files merged by step."""
    from lossguard.core.records import EVENT, Record
    from lossguard.monitor.sinks import JsonlSink, record_line

    for rank in range(ranks):
        sink = JsonlSink(str(tmp_path), rank, {"world_size": ranks})
        for step in range(1, 11):
            sink.write(record_line(Record(step, rank, {"loss": 2.5 - step * 0.01})))
            if step == 4 and rank == ranks - 1:
                sink.write(record_line(Record(step, rank, kind=EVENT, event="internal-error",
                                              data={"detail": "TypeError in a detector"})))
        sink.close()
    diagnosis = analyze([tmp_path])
    assert diagnosis.verdict == "warning", diagnosis.verdict
    expected = f"live guard stopped analysing at step 4 on rank {ranks - 1} (TypeError in a detector)"
    assert any(expected in why for why in diagnosis.incomplete), diagnosis.incomplete
