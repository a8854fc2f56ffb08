import os
import signal
import subprocess
import sys
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


def run_cli(*args, stdin: bytes | None = None, timeout: float = 120, env: dict | None = None):
    """Run `python -m lossguard ARGS` in a real subprocess with this checkout's src on the path."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **(env or {})}
    return subprocess.run([sys.executable, "-m", "lossguard", *map(str, args)], input=stdin,
                          capture_output=True, timeout=timeout, env=full_env)


@pytest.fixture
def cli():
    return run_cli
