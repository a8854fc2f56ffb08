"""`import lossguard` stays light: the live guard's entry points, and the frameworks they need, load on first use."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def test_import_lossguard_loads_no_framework_and_exports_resolve_lazily():
    code = ("import sys, lossguard; heavy = [m for m in ('torch', 'lightning', 'transformers', 'deepspeed') "
            "if m in sys.modules]; assert not heavy, heavy; "
            "assert 'LossguardLightningCallback' in lossguard.__all__; print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(SRC)},
                          capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "ok", proc.stderr


def test_the_lightning_callback_is_a_lightning_callback():
    import pytest

    pytest.importorskip("lightning")
    from lightning.pytorch import Callback

    import lossguard

    assert issubclass(lossguard.LossguardLightningCallback, Callback)
