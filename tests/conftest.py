import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"


def run_cli(*args, stdin: bytes | None = None, timeout: float = 120, env: dict | None = None):
    """Run `python -m lossguard ARGS` in a real subprocess with this checkout's src on the path."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **(env or {})}
    return subprocess.run([sys.executable, "-m", "lossguard", *map(str, args)], input=stdin,
                          capture_output=True, timeout=timeout, env=full_env)


@pytest.fixture
def cli():
    return run_cli
