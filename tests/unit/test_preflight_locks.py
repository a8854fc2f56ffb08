"""A torch extension build lock left by a killed build makes every later job that JIT-builds that op (DeepSpeed's
ops) wait forever; demo, probe and watch warn about one before the job starts."""

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
