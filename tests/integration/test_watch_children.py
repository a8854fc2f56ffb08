"""`lossguard watch` against small fake children (real subprocesses, real signals): pass-through, exit
codes, signal escalation, orphans, Ctrl-C, odd output. The real DeepSpeed / Trainer jobs are in
test_watch.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lossguard.procs import job_members as group_members  # token None: the process group alone

from .watch_helpers import assert_no_orphans, child, env, report, run_watch, watch_cmd

pytestmark = pytest.mark.integration

DEAD = "{'loss': '0', 'grad_norm': '0', 'learning_rate': '0.001', 'epoch': '%s'}"

# Deterministic output with everything a terminal shows: colours, tqdm `\r` redraws on stderr, HF dicts
# after tqdm text, DeepSpeed INFO lines, invalid UTF-8, NUL bytes, a last line without a newline.
HEALTHY = r"""
import os, sys
out, err = sys.stdout.buffer, sys.stderr.buffer
err.write(b"[2026-01-01 00:00:00,000] [INFO] [real_accelerator.py:260:get_accelerator] Setting ds_accelerator to cpu\n")
out.write(b"\x1b[32mstarting\x1b[0m \xff\xfe\x00 junk\n")
loss = 4.6
for step in range(1, 41):
    err.write(b"\r %3d%%|#   | %d/40 [00:01<00:09, 9.5it/s]" % (step * 100 // 40, step))
    err.flush()
    if step % 4 == 0:
        loss *= 0.93
        grad = 1.0 + 0.37 * (step % 3)
        out.write(("{'loss': '%.4g', 'grad_norm': '%.4g', 'learning_rate': '%.4g', 'epoch': '%.2f'}\n"
                   % (loss, grad, 1e-3 * (1 - step / 40), step / 40)).encode())
        out.flush()
out.write(b"{'train_runtime': '1.0', 'train_loss': '4.1', 'epoch': '1.0'}\n")
out.write(b"done, no newline at the end")
out.flush()
err.write(b"\n")
sys.exit(7)
"""


def test_healthy_child_passes_through_byte_for_byte(tmp_path):
    plain = subprocess.run(child(HEALTHY), capture_output=True, timeout=60)
    watched = run_watch("-q", "--halt-on", "warning", "--report", str(tmp_path), "--", *child(HEALTHY))
    assert watched.stdout == plain.stdout
    assert watched.stderr == plain.stderr  # -q: nothing of ours on a healthy run
    assert watched.returncode == plain.returncode == 7
    data = report(tmp_path)
    assert data["verdict"] == "healthy" and data["signature"] is None
    assert data["watch"]["halted"] is False and data["watch"]["exit_code"] == 7
    assert data["stats"]["train_logs"] == 10
    # The log holds every byte of both streams.
    assert (tmp_path / "watch.log").stat().st_size == len(plain.stdout) + len(plain.stderr)


def test_healthy_child_summary_line_without_quiet(tmp_path):
    watched = run_watch("--", *child(HEALTHY))
    plain = subprocess.run(child(HEALTHY), capture_output=True, timeout=60)
    assert watched.stdout == plain.stdout
    assert watched.stderr.startswith(plain.stderr)
    assert b"lossguard watch: healthy, 10 training logs" in watched.stderr[len(plain.stderr):]


@pytest.mark.parametrize(("code", "expected"), [
    ("import sys; print('step 1'); sys.exit(0)", 0),
    ("import sys; print('step 1'); sys.exit(42)", 42),
    ("print('step 1'); raise RuntimeError('CUDA error: an illegal memory access')", 1),
    ("import os, signal; print('x', flush=True); os.kill(os.getpid(), signal.SIGKILL)", 128 + 9),
    ("import os, signal; print('x', flush=True); os.kill(os.getpid(), signal.SIGTERM)", 128 + 15),
    ("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", 128 + 11),
])
def test_exit_status_is_the_childs(tmp_path, code, expected):
    result = run_watch("--halt-on", "broken", "--report", str(tmp_path), "--", *child(code))
    assert result.returncode == expected, result.stderr
    data = report(tmp_path)
    assert data["watch"]["halted"] is False
    assert_no_orphans(data)
    if "RuntimeError" in code:
        assert b"RuntimeError: CUDA error" in result.stderr


def test_command_not_found_and_not_executable(tmp_path):
    missing = run_watch("--", "no-such-command-lossguard")
    assert missing.returncode == 127 and b"command not found" in missing.stderr
    script = tmp_path / "not_executable.sh"
    script.write_text("echo hi\n")
    denied = run_watch("--", str(script))
    assert denied.returncode == 126 and b"not executable" in denied.stderr
    usage = run_watch()
    assert usage.returncode == 2


def _dead_child(*, ignore: tuple[str, ...] = (), interval_s: float = 0.05, steps: int = 2000) -> list[str]:
    ignores = "".join(f"signal.signal(signal.{name}, signal.SIG_IGN)\n" for name in ignore)
    return child(f"""
import signal, sys, time
{ignores}
for i in range(1, {steps}):
    print({DEAD!r} % i)
    time.sleep({interval_s})
""")


def test_halt_on_broken_stops_at_the_revealing_line(tmp_path):
    start = time.monotonic()
    result = run_watch("--halt-on", "broken", "--grace", "5", "--report", str(tmp_path), "--",
                       *_dead_child(interval_s=0.2))
    assert result.returncode == 3
    assert time.monotonic() - start < 20
    data = report(tmp_path)
    assert data["signature"] == "masked-labels" and data["verdict"] == "broken"
    watch = data["watch"]
    assert watch["halted"] and watch["halt_line"] == 1  # one (0, 0) log reveals it
    assert [s["signal"] for s in watch["signals"]] == ["SIGINT"]  # python dies of KeyboardInterrupt
    assert watch["returncode"] != 0
    printed = result.stdout.count(b"{'loss'")
    assert printed <= watch["halt_line"] + 1  # at most one more log after the revealing one
    assert b"masked-labels" in result.stderr and b"fix:" in result.stderr
    html = tmp_path / "report.html"  # written when the HTML reporter is installed (it is in this repo)
    assert b"masked-labels" in html.read_bytes()
    assert_no_orphans(data)


def test_child_ignoring_sigint_gets_sigterm_after_grace(tmp_path):
    result = run_watch("--halt-on", "broken", "--grace", "1", "--report", str(tmp_path), "--",
                       *_dead_child(ignore=("SIGINT",)))
    assert result.returncode == 3
    watch = report(tmp_path)["watch"]
    assert [s["signal"] for s in watch["signals"]] == ["SIGINT", "SIGTERM"]
    gap = watch["signals"][1]["after_s"] - watch["signals"][0]["after_s"]
    assert 0.9 <= gap < 5
    assert watch["returncode"] == -signal.SIGTERM
    assert_no_orphans(report(tmp_path))


def test_child_ignoring_sigint_and_sigterm_gets_sigkill(tmp_path):
    result = run_watch("--halt-on", "broken", "--grace", "0.5", "--report", str(tmp_path), "--",
                       *_dead_child(ignore=("SIGINT", "SIGTERM")))
    assert result.returncode == 3
    watch = report(tmp_path)["watch"]
    assert [s["signal"] for s in watch["signals"]] == ["SIGINT", "SIGTERM", "SIGKILL"]
    assert watch["returncode"] == -signal.SIGKILL
    assert_no_orphans(report(tmp_path))


def test_grandchildren_in_the_group_are_stopped_too(tmp_path):
    """A launcher that dies and leaves its workers running (torchrun SIGKILLed): the workers hold the
    pipes; watch stops the whole group and leaves no orphan."""
    code = f"""
import subprocess, sys, time
worker = {_dead_child(ignore=("SIGINT",), interval_s=0.1)!r}
subprocess.Popen(worker)
subprocess.Popen([sys.executable, "-c", "import time, signal; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(600)"])
time.sleep(0.3)
sys.exit(0)  # the launcher exits at once, its workers keep running in its process group
"""
    result = run_watch("--halt-on", "broken", "--grace", "1", "--report", str(tmp_path), "--", *child(code))
    assert result.returncode == 3
    data = report(tmp_path)
    assert data["signature"] == "masked-labels"
    assert "SIGTERM" in [s["signal"] for s in data["watch"]["signals"]]
    assert_no_orphans(data)


def test_leftover_processes_after_a_clean_exit_are_terminated(tmp_path):
    code = """
import subprocess, sys
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], stdout=subprocess.DEVNULL,
                 stderr=subprocess.DEVNULL)
print("launcher done")
"""
    start = time.monotonic()
    result = run_watch("--grace", "0.5", "--report", str(tmp_path), "--", *child(code))
    assert result.returncode == 0
    assert time.monotonic() - start < 15
    data = report(tmp_path)
    assert [s["signal"] for s in data["watch"]["signals"]] == ["SIGTERM"]
    assert_no_orphans(data)


def test_leftover_in_a_session_of_its_own_is_terminated(tmp_path):
    """torchrun starts each rank in a session of its own, outside the command's process group: a rank
    left running after the launcher exits is still the command's (it carries watch's job token)."""
    code = """
import subprocess, sys
rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL, start_new_session=True)
print("rank pid", rank.pid)
"""
    result = run_watch("--grace", "0.5", "--report", str(tmp_path), "--", *child(code))
    assert result.returncode == 0
    rank = int(result.stdout.decode().split("rank pid ")[1].split()[0])
    assert [s["signal"] for s in report(tmp_path)["watch"]["signals"]] == ["SIGTERM"]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(rank):
        time.sleep(0.1)
    assert not _alive(rank), f"the rank {rank} outside the process group outlived watch"


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def test_ctrl_c_is_forwarded_and_the_childs_status_returned(tmp_path):
    code = """
import sys, time
print("ready", flush=True)
try:
    time.sleep(60)
except KeyboardInterrupt:
    print("child got SIGINT", flush=True)
    sys.exit(130)
"""
    proc = subprocess.Popen(watch_cmd("--report", str(tmp_path), "--", *child(code)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env())
    assert proc.stdout.readline() == b"ready\n"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert b"child got SIGINT" in out
    data = report(tmp_path)
    assert [s["signal"] for s in data["watch"]["signals"]] == ["SIGINT"]
    assert data["watch"]["halted"] is False
    assert_no_orphans(data)


def test_second_ctrl_c_escalates(tmp_path):
    code = """
import signal, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(60)
"""
    proc = subprocess.Popen(watch_cmd("--grace", "30", "--report", str(tmp_path), "--", *child(code)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env())
    assert proc.stdout.readline() == b"ready\n"
    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM
    assert [s["signal"] for s in report(tmp_path)["watch"]["signals"]] == ["SIGINT", "SIGTERM"]


def test_sigterm_to_watch_is_forwarded(tmp_path):
    code = """
import time
from pathlib import Path
print("ready", flush=True)
time.sleep(60)
"""
    proc = subprocess.Popen(watch_cmd("--report", str(tmp_path), "--", *child(code)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env())
    assert proc.stdout.readline() == b"ready\n"
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM
    assert_no_orphans(report(tmp_path))


def test_child_that_closes_stdout_early(tmp_path):
    code = f"""
import os, sys, time
print({DEAD!r} % 1, flush=True)
os.close(1)
time.sleep(0.5)
sys.stderr.write("still running after closing stdout\\n")
sys.exit(5)
"""
    result = run_watch("--report", str(tmp_path), "--", *child(code))
    assert result.returncode == 5
    assert result.stdout.startswith(b"{'loss': '0'")
    assert b"still running after closing stdout" in result.stderr


def test_banner_waits_for_a_line_boundary(tmp_path):
    """The child is in the middle of a tqdm line when the finding comes: the banner is not written into
    it. Here the bar's line ends within the wait, so the banner comes right after that newline."""
    code = f"""
import sys, time
sys.stderr.write("\\r 10%|#  | 1/10"); sys.stderr.flush()
time.sleep(0.1)
for i in (1, 2):
    print({DEAD!r} % i, flush=True)
time.sleep(0.2)
sys.stderr.write("\\r 20%|## | 2/10\\n"); sys.stderr.flush()
time.sleep(0.3)
"""
    result = run_watch("--report", str(tmp_path), "--", *child(code))
    assert result.returncode == 0
    err = result.stderr
    bar_end = err.index(b" 2/10\n") + len(b" 2/10\n")
    assert err.index(b"lossguard: BROKEN") > bar_end
    assert err.startswith(b"\r 10%|#  | 1/10\r 20%|## | 2/10\n")


def test_banner_breaks_a_line_that_never_ends(tmp_path):
    code = f"""
import sys, time
sys.stderr.write("\\r 10%|#  | 1/10"); sys.stderr.flush()
time.sleep(0.1)
for i in (1, 2):
    print({DEAD!r} % i, flush=True)
time.sleep(1.5)
sys.stderr.write("\\r 20%|## | 2/10"); sys.stderr.flush()
"""
    result = run_watch("--report", str(tmp_path), "--", *child(code))
    err = result.stderr
    # The bar's bytes are intact; the banner starts on a line of its own, after the first redraw.
    assert err.startswith(b"\r 10%|#  | 1/10\n")
    banner_at = err.index(b"lossguard: BROKEN")
    assert err.index(b"\r 20%|## | 2/10") > banner_at


def test_odd_output_long_lines_junk_duplicates_prefixes_and_interleaved_ranks(tmp_path):
    """3 MiB without a newline (then the dict at its end), binary junk, per-node duplicates with host
    prefixes, and two 'ranks' writing to the same pipe at once."""
    code = r"""
import os, subprocess, sys
out = sys.stdout.buffer
out.write(os.urandom(1 << 16).replace(b"\n", b" ") + b"\n")
out.write(b"#" * (3 << 20) + b"{'loss': '2.5', 'grad_norm': '0.9', 'learning_rate': '0.001', 'epoch': '0.1'}\n")
for epoch in (0.2, 0.3):
    line = b"{'loss': '2.4', 'grad_norm': '0.8', 'learning_rate': '0.001', 'epoch': '%.1f'}\n" % epoch
    out.write(b"node-1: " + line + b"node-2: " + line)
out.flush()
rank = "import sys\nfor i in range(2000): sys.stdout.write('[rank%d] INFO step line %d\\n' % (int(sys.argv[1]), i))"
procs = [subprocess.Popen([sys.executable, "-c", rank, str(r)]) for r in (0, 1)]
for p in procs: p.wait()
for i in range(1, 4):
    out.write(b"[rank0]: {'loss': '0', 'grad_norm': 'nan', 'learning_rate': '0.001', 'epoch': '0.%d'}\n" % (i + 3))
out.flush()
"""
    result = run_watch("--report", str(tmp_path), "--", *child(code), timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    plain_size = len(result.stdout)
    assert plain_size > 3 << 20
    assert (tmp_path / "watch.log").stat().st_size == plain_size  # this child writes nothing on stderr
    data = report(tmp_path)
    assert data["stats"]["train_logs"] == 6  # 1 after the long line + 2 deduplicated + 3 dead
    assert data["signature"] in ("nonfinite-hidden", "nonfinite")
    assert result.stdout.count(b"INFO step line") == 4000


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_group_members_helper_sees_a_live_group():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], process_group=0)
    try:
        assert group_members(proc.pid) == [proc.pid]
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert group_members(proc.pid) == []


def test_a_line_longer_than_the_cap_makes_the_report_incomplete(tmp_path):
    """A healthy run that printed one 2 MB line (a dumped tensor): the line's head is not parsed, and the
    report says so instead of a clean healthy."""
    code = "import sys\nsys.stdout.write('x' * (2 << 20) + '\\n')\n" + HEALTHY
    result = run_watch("--report", str(tmp_path), "--", *child(code))
    assert result.returncode == 7
    data = report(tmp_path)
    assert data["verdict"] == "warning" and data["stats"]["train_logs"] == 10
    assert data["incomplete"] and "1 line(s) longer than" in data["incomplete"][0]
    assert "SRC001" in [f["code"] for f in data["findings"]]


def test_an_internal_error_in_the_live_analysis_is_incomplete_not_healthy(tmp_path, monkeypatch):
    """A lossguard bug in the analysis (injected here) never stops the command, and the run it no longer
    checked is never reported healthy."""
    from lossguard.watch import watch
    from lossguard.watch.analyzer import LiveAnalyzer

    feed, calls = LiveAnalyzer.feed, []

    def failing_feed(self, body, **kwargs):
        calls.append(len(body))
        if len(calls) == 2:
            raise RuntimeError("injected")
        return feed(self, body, **kwargs)

    monkeypatch.setattr(LiveAnalyzer, "feed", failing_feed)
    result = watch(child(HEALTHY), report_dir=tmp_path, halt_on="warning")
    assert result.exit_code == 7 and not result.outcome.halted
    assert result.diagnosis.verdict == "warning"
    assert any("internal error (RuntimeError: injected)" in why for why in report(tmp_path)["incomplete"])
