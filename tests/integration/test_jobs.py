"""No job lossguard starts outlives it: the launcher's whole process group goes, ranks included.

Real processes throughout: small Python process trees for the launcher's own rules (a child that ignores
SIGTERM, a child left behind by a launcher that exited), then real two-rank torchrun jobs stopped mid-run
by a timeout, and `lossguard demo` / `lossguard probe` killed from outside while their ranks train.
Survivors are found with `ps`, independently of the launcher's own bookkeeping.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from lossguard.probe.job import Job
from lossguard.probe.launch import build_command, free_port, job_env, run_scenario
from tests.conftest import ROOT

pytestmark = pytest.mark.integration


def live_processes(marker: str, exclude: set[int] = frozenset()) -> list[tuple[int, int, str]]:
    """(pid, pgid, args) of every live (not zombie) process whose command line mentions `marker`."""
    out = subprocess.run(["ps", "-ww", "-eo", "pid=,pgid=,stat=,args="], capture_output=True, text=True).stdout
    found = []
    for line in out.splitlines():
        pid, pgid, stat, args = line.split(None, 3)
        if marker in args and not stat.startswith("Z") and int(pid) not in exclude | {os.getpid()}:
            found.append((int(pid), int(pgid), args))
    return found


def group_alive(pgid: int) -> list[str]:
    out = subprocess.run(["ps", "-ww", "-eo", "pgid=,stat=,args="], capture_output=True, text=True).stdout
    return [line for line in out.splitlines()
            if int(line.split()[0]) == pgid and not line.split()[1].startswith("Z")]


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def tree_script(tmp_path: Path, child_body: str, parent_tail: str) -> list[str]:
    """A launcher that forks one child (written to child.pid once it is running), then `parent_tail`."""
    script = tmp_path / "tree.py"
    script.write_text(textwrap.dedent(f"""
        import os, signal, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", {child_body!r}])
        while not os.path.exists("child.ready"):
            time.sleep(0.05)
        open("child.pid", "w").write(str(child.pid))
        {parent_tail}
    """))
    return [sys.executable, str(script)]


CHILD_IGNORES_TERM = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                      "open('child.ready', 'w').close(); time.sleep(600)")


def test_timeout_kills_a_child_that_ignores_sigterm(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = tree_script(tmp_path, CHILD_IGNORES_TERM, "time.sleep(600)")
    with Job(argv, tmp_path / "log", term_grace_s=1.0) as job:
        returncode = job.wait(timeout_s=3.0, tick_s=0.1)
    assert job.timed_out and returncode != 0
    child = int((tmp_path / "child.pid").read_text())
    assert not group_alive(job.pgid), group_alive(job.pgid)
    assert child not in [pid for pid, _, _ in live_processes("")]  # dead (at most a zombie awaiting init)


def test_a_child_left_behind_by_a_finished_launcher_is_stopped(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = tree_script(tmp_path, "import time; open('child.ready', 'w').close(); time.sleep(600)",
                       "sys.exit(0)")
    with Job(argv, tmp_path / "log") as job:
        assert job.wait(timeout_s=60) == 0
    assert not job.timed_out
    assert not group_alive(job.pgid), group_alive(job.pgid)


def test_an_exception_in_the_caller_stops_the_job(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = tree_script(tmp_path, "import time; open('child.ready', 'w').close(); time.sleep(600)",
                       "time.sleep(600)")
    with pytest.raises(KeyboardInterrupt), Job(argv, tmp_path / "log") as job:
        wait_for(lambda: (tmp_path / "child.pid").exists(), 30, "the child")
        raise KeyboardInterrupt
    assert not group_alive(job.pgid), group_alive(job.pgid)


def ranks_of(tmp_path: Path) -> list[tuple[int, int, str]]:
    """The rank processes (the launcher's command line names the module too)."""
    return [p for p in live_processes(str(tmp_path)) if "lossguard.probe.train_job" in p[2]
            and "torchrun" not in p[2] and "torch.distributed.run" not in p[2]]


def test_a_two_rank_job_stopped_mid_run_leaves_no_rank(tmp_path):
    cmd = build_command("healthy-raw", tmp_path, nproc=2, port=free_port(), steps=100_000, config_json=None)
    with Job(cmd, tmp_path / "stdout.log", env=job_env(None)) as job:
        ranks = wait_for(lambda: len(ranks_of(tmp_path)) == 2 and ranks_of(tmp_path), 120, "two ranks")
        # torchrun starts every rank in a session of its own: the launcher's process group is not enough
        assert all(pgid != job.pgid for _, pgid, _ in ranks)
        job.stop()
    assert not live_processes(str(tmp_path)), live_processes(str(tmp_path))


def test_ranks_orphaned_by_a_launcher_killed_alone_are_stopped(tmp_path):
    cmd = build_command("healthy-raw", tmp_path, nproc=2, port=free_port(), steps=100_000, config_json=None)
    with Job(cmd, tmp_path / "stdout.log", env=job_env(None)) as job:
        wait_for(lambda: len(ranks_of(tmp_path)) == 2, 120, "two ranks")
        os.kill(job.proc.pid, signal.SIGKILL)  # torchrun dies without telling its ranks (as `kill -9` does)
        job.proc.wait()
        time.sleep(1.0)
        assert len(ranks_of(tmp_path)) == 2  # orphaned, still training
        job.wait(timeout_s=60)
    assert not live_processes(str(tmp_path)), live_processes(str(tmp_path))


def test_a_zoo_run_that_overstays_its_timeout_leaves_no_rank(tmp_path):
    # Steps enough that no machine finishes within the timeout (the default run ends in under 8 s on a
    # fast CPU, and then nothing is timed out).
    result = run_scenario("healthy-raw", tmp_path, steps=100_000, timeout_s=8.0)
    assert result.timed_out
    assert not live_processes(str(tmp_path)), live_processes(str(tmp_path))


def cli_killed_mid_run(tmp_path: Path, sig: int, *args: str) -> tuple[subprocess.CompletedProcess, list]:
    """Start `python -m lossguard ARGS` in its own session, wait for its ranks, send `sig`; what it left."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen([sys.executable, "-m", "lossguard", *args], env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: len(ranks_of(tmp_path)) >= 2, 180, "the job's ranks")
        proc.send_signal(sig)
        output = proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    left = live_processes(str(tmp_path), {proc.pid})
    return subprocess.CompletedProcess(proc.args, proc.returncode, output), left


def test_a_killed_demo_leaves_no_rank_behind(tmp_path):
    done, left = cli_killed_mid_run(tmp_path, signal.SIGTERM, "demo", "--out", str(tmp_path))
    assert done.returncode == 128 + signal.SIGTERM, done.stdout.decode()[-2000:]
    assert not left, left


def test_an_interrupted_parallel_probe_leaves_no_rank_behind(tmp_path):
    config = tmp_path / "ds.json"
    config.write_text('{"zero_optimization": {"stage": 2}}')
    arms = tmp_path / "arms.json"
    arms.write_text('[{"name": "zero1", "changes": {"zero_optimization.stage": 1}}]')
    done, left = cli_killed_mid_run(tmp_path, signal.SIGINT, "probe", str(config), "--arms", str(arms),
                                    "--parallel", "--report", str(tmp_path / "report"))
    assert done.returncode != 0
    assert not left, left
