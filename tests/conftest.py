import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"

# A test run started in the background by a non-interactive shell (`make test &`, a CI runner's `cmd &`)
# inherits SIGINT ignored, and every process it starts would too: `watch` keeps an ignored SIGINT ignored
# (nohup semantics), and a Python child never turns it into KeyboardInterrupt. The Ctrl-C tests model a
# user at a terminal, so the run takes SIGINT's terminal default back; a Python handler is reset to the
# default in every process the tests exec.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# DeepSpeed's CPU communication op is compiled on first use into torch's extension cache, shared by every
# install on the machine and keyed by the install's source paths, so a second checkout rebuilds it there.
# A test that stops a job on purpose (a timeout, Ctrl-C) can stop it mid-build, and the build's lock file
# then makes every later DeepSpeed job on the machine wait forever. Each install gets a cache of its own:
# this suite's stops can only meet a build of this install's, which its first jobs finish.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))


@pytest.fixture(autouse=True)
def _no_build_lock_outlives_its_test():
    """torch takes an extension's `lock` on every JIT load of a DeepSpeed op (it runs ninja, a no-op when the
    op is built), not only on the first build. A test that stops a job on purpose can stop it inside that
    window, and the lock then makes every later DeepSpeed job of the suite wait forever (seen in a loaded
    clean-clone CI run: a killed demo, then the 600 s timeout of every live DeepSpeed test). The jobs a test
    started are gone when it ends (the tests assert it), so a lock made during the test that no build is
    running in (no process works in its folder) belongs to no one: remove it."""
    start = time.time()
    yield
    root = Path(os.environ["TORCH_EXTENSIONS_DIR"])
    if not root.is_dir():
        return
    for lock in root.glob("**/lock"):
        with contextlib.suppress(OSError):
            if lock.stat().st_mtime >= start - 1 and not _someone_works_in(lock.parent):
                lock.unlink()


def _someone_works_in(folder: Path) -> bool:
    """A live process whose working directory is `folder` (ninja and the compiler run there)."""
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if Path(os.readlink(proc / "cwd")) == folder:
                return True
    return False


def run_cli(*args, stdin: bytes | None = None, timeout: float = 120, env: dict | None = None):
    """Run `python -m lossguard ARGS` in a real subprocess with this checkout's src on the path."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **(env or {})}
    return subprocess.run([sys.executable, "-m", "lossguard", *map(str, args)], input=stdin,
                          capture_output=True, timeout=timeout, env=full_env)


@pytest.fixture
def cli():
    return run_cli
