"""The auto-attach hook in a real child interpreter: it chains the sitecustomize it shadows, installs its
finder, patches `deepspeed.initialize` at import, and never breaks the job when attaching fails.

The `deepspeed` here is a stand-in module in a temp dir (importing the real one costs seconds; the real
one is covered by tests/integration/test_probe.py): its `initialize` returns an object that is no engine,
so `lossguard.attach` fails, which is the failure path under test."""

from __future__ import annotations

import subprocess
import sys

from lossguard.monitor.autoattach import child_env


def run(tmp_path, code: str, **extra):
    env = child_env(extra.pop("env", None))
    env["PYTHONPATH"] += ":" + str(tmp_path)
    env.update(extra)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60,
                          cwd=tmp_path)


def test_chains_existing_sitecustomize_and_installs(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("import os\nos.environ['CHAINED'] = 'yes'\n")
    proc = run(tmp_path, "import os, sys; print(os.environ.get('CHAINED'), "
                         "any(type(f).__name__ == '_Finder' for f in sys.meta_path))")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["yes", "True"]


def test_patches_deepspeed_and_never_breaks_the_job(tmp_path):
    (tmp_path / "deepspeed.py").write_text("def initialize(**kw):\n    return ('not-an-engine', None, None, None)\n")
    proc = run(tmp_path, "import deepspeed\nprint(getattr(deepspeed.initialize, '_lossguard_wrapped', False))\n"
                         "print(deepspeed.initialize(model=None)[0])\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "not-an-engine"]
    assert "lossguard auto-attach: cannot attach to the DeepSpeed engine" in proc.stderr


def test_switch_off(tmp_path):
    (tmp_path / "deepspeed.py").write_text("def initialize(**kw):\n    return (1,)\n")
    proc = run(tmp_path, "import deepspeed; print(hasattr(deepspeed.initialize, '_lossguard_wrapped'))",
               LOSSGUARD_AUTOATTACH="0")
    assert proc.stdout.strip() == "False" and proc.stderr == ""
