"""Shared helpers for the `watch` tests: run the real CLI in a subprocess, read its report, check orphans."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import lossguard
from lossguard.procs import job_members as group_members  # token None: the process group alone

SRC_DIR = str(Path(lossguard.__file__).resolve().parent.parent)
JOBS_DIR = Path(__file__).resolve().parent / "watch_jobs"


def env(**extra: str) -> dict[str, str]:
    out = dict(os.environ)
    out["PYTHONPATH"] = SRC_DIR + (os.pathsep + out["PYTHONPATH"] if out.get("PYTHONPATH") else "")
    out.update(extra)
    return out


def watch_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "lossguard", "watch", *args]


def run_watch(*args: str, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(watch_cmd(*args), capture_output=True, timeout=timeout, env=env(), **kwargs)


def child(code: str) -> list[str]:
    """A fake child: `python -c CODE`, unbuffered like watch would make it anyway."""
    return [sys.executable, "-u", "-c", code]


def report(report_dir: Path) -> dict:
    return json.loads((report_dir / "report.json").read_text())


def assert_no_orphans(report_json: dict) -> None:
    pgid = report_json["watch"]["pid"]
    assert pgid, report_json["watch"]
    assert group_members(pgid) == [], f"processes left in the command's process group {pgid}"
