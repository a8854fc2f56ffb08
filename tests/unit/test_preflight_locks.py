"""A torch extension build lock left by a killed build makes every later job that JIT-builds that op (DeepSpeed's
ops) wait forever; demo, probe and watch warn about one before the job starts, and a job that lossguard's
`Job` stops leaves none of its own behind."""

import os
import sys
import time

from lossguard.probe.preflight import STALE_LOCK_MINUTES, extensions_root, stale_build_locks


def _lock(folder, minutes_ago: float):
    folder.mkdir(parents=True)
    lock = folder / "lock"
    lock.write_text("")
    then = time.time() - minutes_ago * 60
    os.utime(lock, (then, then))
    return lock


def test_a_lock_no_build_touched_for_long_is_named_with_its_fix(tmp_path):
    root = tmp_path / "ext"
    old = _lock(root / "deepspeed_shm_comm", STALE_LOCK_MINUTES + 5)  # TORCH_EXTENSIONS_DIR: ops right under it
    nested = _lock(root / "py311_cu121" / "fused_adam", 3 * STALE_LOCK_MINUTES)  # torch's default layout
    _lock(root / "py311_cpu" / "cpu_adam", 1)  # a build running now
    warnings = stale_build_locks({"TORCH_EXTENSIONS_DIR": str(root)})
    assert len(warnings) == 2
    assert str(old) in warnings[0] and f"rm {old}" in warnings[0] and "deepspeed_shm_comm" in warnings[0]
    assert str(nested) in warnings[1] and "fused_adam" in warnings[1] and "45 min" in warnings[1]


def test_no_extensions_folder_or_a_fresh_lock_says_nothing(tmp_path):
    assert stale_build_locks({"TORCH_EXTENSIONS_DIR": str(tmp_path / "none")}) == []
    _lock(tmp_path / "ext" / "op", 0)
    assert stale_build_locks({"TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")}) == []


def test_the_default_root_is_torchs_per_user_cache(tmp_path):
    if sys.platform.startswith("linux"):
        assert extensions_root({"HOME": "/h"}) == extensions_root({"HOME": "/h", "TORCH_EXTENSIONS_DIR": ""})
        assert str(extensions_root({"HOME": "/h"})) == "/h/.cache/torch_extensions"
        assert str(extensions_root({"HOME": "/h", "XDG_CACHE_HOME": "/c"})) == "/c/torch_extensions"


def test_watch_warns_before_the_job_starts(tmp_path, cli):
    lock = _lock(tmp_path / "ext" / "deepspeed_shm_comm", 2 * STALE_LOCK_MINUTES)
    proc = cli("watch", "--", sys.executable, "-c", "print('step 1 loss 2.5'); print('step 2 loss 2.4')",
               env={"TORCH_EXTENSIONS_DIR": str(tmp_path / "ext")})
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    assert f"lossguard: warning: {lock} is a build lock" in err and f"rm {lock}" in err


def test_a_job_lossguard_stops_leaves_no_build_lock_of_its_own_behind(tmp_path):
    """A job stopped by lossguard (a timeout, a halt, Ctrl-C) inside torch's JIT-load window leaves its op's
    `lock`: removed once the job is gone. A lock some live process holds open (a build running) and one
    older than the job are not the job's: kept."""
    from lossguard.probe.job import Job

    root = tmp_path / "ext"
    older = _lock(root / "old_op", 60)
    job = Job([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "job.log",
              env={**os.environ, "TORCH_EXTENSIONS_DIR": str(root)})
    left = root / "deepspeed_shm_comm" / "lock"
    left.parent.mkdir(parents=True)
    left.write_text("")  # the killed job's: nobody has it open
    held = root / "building_op" / "lock"
    held.parent.mkdir(parents=True)
    fd = os.open(held, os.O_CREAT | os.O_EXCL)  # a build in progress holds its lock open, as torch's FileBaton does
    try:
        time.sleep(0.2)
        job.stop()
        assert not job.members()
        assert not left.exists() and held.exists() and older.exists()
    finally:
        os.close(fd)


def _watched(tmp_path, script: str):
    """`watch(halt_on="broken")` over a Python command that makes its op's build lock, as torch's JIT load
    does, then runs `script`; (the outcome, the lock it made, a lock a live build holds open, an older one)."""
    from lossguard.watch import watch

    root = tmp_path / "ext"
    older = _lock(root / "old_op", 60)
    held = root / "building_op" / "lock"
    held.parent.mkdir(parents=True)
    fd = os.open(held, os.O_CREAT | os.O_EXCL)  # a build in progress holds its lock open, as torch's FileBaton does
    left = root / "deepspeed_shm_comm" / "lock"
    code = (f"import os, sys, time; os.makedirs({str(left.parent)!r}, exist_ok=True); open({str(left)!r}, 'w')"
            f".close()\n{script}")
    try:
        result = watch([sys.executable, "-c", code], halt_on="broken", grace_s=5.0,
                       env={**os.environ, "TORCH_EXTENSIONS_DIR": str(root)}, color=False)
        assert held.exists() and older.exists()  # a live build's and an older one: never the job's
    finally:
        os.close(fd)
    return result.outcome, left


def test_a_job_watch_stops_leaves_no_build_lock_of_its_own_behind(tmp_path):
    """The job prints a NaN loss (halt_on="broken": watch stops it) while its op's `lock` is still there,
    as in torch's JIT-load window: once the job is gone, watch removes the lock it left."""
    outcome, left = _watched(tmp_path, "print('step 1 loss 2.5'); print('step 2 loss nan', flush=True); "
                                       "time.sleep(60)")
    assert outcome.halted and outcome.signals and outcome.wall_s < 30
    assert not left.exists()


def test_a_job_that_ends_by_itself_keeps_its_locks(tmp_path):
    """The twin: watch stopped nothing, so the locks are the job's own business (torch removes its own)."""
    outcome, left = _watched(tmp_path, "print('step 1 loss 2.5'); print('step 2 loss 2.4')")
    assert not outcome.signals and outcome.returncode == 0
    assert left.exists()
