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


def run_cli(*args, stdin: bytes | None = None, timeout: float = 120, env: dict | None = None):
    """Run `python -m lossguard ARGS` in a real subprocess with this checkout's src on the path."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **(env or {})}
    return subprocess.run([sys.executable, "-m", "lossguard", *map(str, args)], input=stdin,
                          capture_output=True, timeout=timeout, env=full_env)


@pytest.fixture
def cli():
    return run_cli
