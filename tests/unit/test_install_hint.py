"""The install command an extra-missing message names works from where lossguard was installed: a
checkout's own path (no package index serves lossguard), or the extra's packages by name elsewhere."""

import shutil
import subprocess
import sys
from pathlib import Path

from lossguard.install_hint import EXTRAS, install_command

ROOT = Path(__file__).resolve().parents[2]


def test_from_a_checkout_the_command_installs_the_extra_from_its_path():
    command = install_command("train")
    assert command.startswith(f"pip install -e '{ROOT}[train]'") and "make setup" in command


def test_from_an_installed_copy_the_command_names_the_extras_packages(tmp_path):
    site = tmp_path / "site-packages"
    shutil.copytree(ROOT / "src" / "lossguard", site / "lossguard",
                    ignore=shutil.ignore_patterns("__pycache__"))
    proc = subprocess.run([sys.executable, "-c", "from lossguard.install_hint import install_command as c; "
                           "print(c('train')); print(c('tensorboard'))"],
                          capture_output=True, text=True, env={"PYTHONPATH": str(site)}, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    train, tensorboard = proc.stdout.splitlines()
    assert train == "pip install " + " ".join(EXTRAS["train"]) and "lossguard[" not in train
    assert tensorboard == "pip install tensorboard"


def test_the_extras_named_match_pyproject():
    text = (ROOT / "pyproject.toml").read_text()
    for extra, packages in EXTRAS.items():
        block = text.split(f"\n{extra} = [", 1)[1].split("]", 1)[0]
        assert sorted(p.strip().strip('"').split(">")[0].split("=")[0] for p in block.split(",") if p.strip()) \
            == sorted(packages), extra
