"""Missing pieces are named before any job starts: a real interpreter without the training stack.

The interpreter is a fresh virtualenv (no pip, no torch) that sees only lossguard's base dependencies
(click, rich, packaging, pyyaml and theirs, linked from the test's own environment): what a user has after
`pip install lossguard` without the `train` extra.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from lossguard.probe.preflight import INSTALL_HINT, MissingPiece, check_job_stack, interpreter_of
from tests.conftest import ROOT

pytestmark = pytest.mark.integration

BASE_DEPS = ["click", "rich", "packaging", "yaml", "_yaml", "markdown_it", "mdurl", "pygments",
             "typing_extensions.py"]


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("bare")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True)
    deps = root / "base-deps"
    deps.mkdir()
    site = Path(sysconfig.get_paths()["purelib"])
    for name in BASE_DEPS:
        if (site / name).exists():
            (deps / name).symlink_to(site / name)
    python = root / "venv" / "bin" / "python"
    venv_site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip()
    Path(venv_site, "base_deps.pth").write_text(f"{deps}\n")
    return str(python)


def bare_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return env


def test_the_check_names_every_missing_module_and_the_extra(bare_python):
    with pytest.raises(MissingPiece) as info:
        check_job_stack("the demo", python=bare_python, env={**bare_env(), "PYTHONPATH": str(ROOT / "src")})
    message = str(info.value)
    assert "torch, deepspeed, transformers, accelerate" in message and INSTALL_HINT in message
    assert bare_python in message and "lossguard itself" not in message


def test_the_check_names_lossguard_when_the_job_cannot_import_it(bare_python):
    with pytest.raises(MissingPiece, match="lossguard itself"):
        check_job_stack("probe's built-in job", python=bare_python, env=bare_env())


def test_the_full_stack_passes():
    check_job_stack("the demo", env={**os.environ, "PYTHONPATH": str(ROOT / "src")})


def test_the_interpreter_behind_a_launcher_script(bare_python):
    torchrun = Path(sys.executable).with_name("torchrun")
    if torchrun.exists():  # a console script: its #! line names the python that runs it
        assert Path(interpreter_of([str(torchrun), "--nproc_per_node", "2"])).resolve() == \
            Path(sys.executable).resolve()
    assert interpreter_of([bare_python, "train.py"]) == bare_python
    assert interpreter_of(["no-such-launcher-here"]) is None


@pytest.mark.parametrize("args", [["demo"], ["probe", "CONFIG"]])
def test_demo_and_probe_without_torch_say_what_to_install_and_exit_2(bare_python, tmp_path, args):
    config = tmp_path / "ds.json"
    config.write_text('{"zero_optimization": {"stage": 2}}')
    argv = [str(config) if a == "CONFIG" else a for a in args]
    proc = subprocess.run([bare_python, "-m", "lossguard", *argv, "--out" if args == ["demo"] else "--report",
                           str(tmp_path / "out")], env={**bare_env(), "PYTHONPATH": str(ROOT / "src")},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "torch" in proc.stderr and INSTALL_HINT in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "out" / "arms").exists() and not (tmp_path / "out" / "dying").exists()
