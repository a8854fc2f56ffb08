"""Versions on the page (issue #15 item 2): every format says which versions a finding assumed and where
from; a version-window rule clean for the assumed release names the releases in wide use it would fire on;
without DeepSpeed installed, lint says how to pass the cluster's versions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import packaging
import yaml

from lossguard.lint.api import lint

SRC = str(Path(__file__).resolve().parents[3] / "src")
OVERLAP = {"bf16": {"enabled": True, "check_grad_overflow": True},
           "zero_optimization": {"stage": 2, "overlap_comm": True}}


def run(*argv: str, pythonpath: str = SRC, isolated: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": pythonpath}
    flags = ["-S"] if isolated else []
    return subprocess.run([sys.executable, *flags, "-m", "lossguard", *argv], capture_output=True, text=True,
                          env=env, timeout=120)


def _files(tmp_path, deepspeed="0.12.6"):
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps(OVERLAP))
    freeze = tmp_path / "freeze.txt"
    freeze.write_text(f"deepspeed=={deepspeed}\ntorch==2.4.1\ntransformers==4.57.0\n")
    return str(cfg), str(freeze)


def test_human_json_sarif_github_name_the_assumed_versions(tmp_path):
    cfg, freeze = _files(tmp_path)
    human = run("lint", cfg, "--env", freeze).stdout
    assert human.startswith(f"versions assumed: DeepSpeed 0.12.6, transformers 4.57.0, torch 2.4.1 (--env {freeze});"
                            " accelerate, peft unknown")
    assert f"    assumed: DeepSpeed 0.12.6 (--env {freeze})" in human
    found = json.loads(run("lint", cfg, "--env", freeze, "--format", "json").stdout)
    overlap = next(f for f in found if f["code"] == "DSC101")
    assert overlap["versions"] == {"deepspeed": {"version": "0.12.6", "from": f"--env {freeze}"}}
    sarif = json.loads(run("lint", cfg, "--env", freeze, "--format", "sarif").stdout)["runs"][0]
    assert sarif["properties"]["versions"]["deepspeed"] == {"version": "0.12.6", "from": f"--env {freeze}"}
    assert sarif["properties"]["versions"]["peft"] == {"version": None, "from": "unknown"}
    result = next(r for r in sarif["results"] if r["ruleId"] == "DSC101")
    assert result["properties"]["versions"]["deepspeed"]["version"] == "0.12.6"
    github = run("lint", cfg, "--env", freeze, "--format", "github").stdout
    assert f"[assumed DeepSpeed 0.12.6 (--env {freeze})]" in github


def test_clean_for_the_assumed_release_names_the_affected_ones(tmp_path):
    cfg, freeze = _files(tmp_path, deepspeed="0.19.8")
    found = json.loads(run("lint", cfg, "--env", freeze, "--format", "json").stdout)
    overlap = next(f for f in found if f["code"] == "DSC101")
    assert overlap["severity"] == "info" and overlap["fix"] is None
    assert overlap["message"].startswith("safe on DeepSpeed 0.19.8 (--env ")
    assert "DeepSpeed >= 0.10.0, < 0.19.3 is affected" in overlap["message"]
    # the API stays quiet unless asked: rule examples and probe arms see the assumed version only
    assert [f.code for f in lint(OVERLAP, None, {"deepspeed": "0.19.8"}, select=["DSC101"])] == []
    asked = lint(OVERLAP, None, {"deepspeed": "0.19.8"}, select=["DSC101"], options={"other_versions": True})
    assert asked[0].data["affected"] == ["DeepSpeed >= 0.10.0, < 0.19.3"]


def test_release_bugs_every_config_has_are_not_probed(tmp_path):
    cfg = tmp_path / "plain.json"
    cfg.write_text(json.dumps({"zero_optimization": {"stage": 2, "overlap_comm": False}}))
    _, freeze = _files(tmp_path, deepspeed="0.19.8")
    found = json.loads(run("lint", str(cfg), "--env", freeze, "--format", "json").stdout)
    assert "ENV301" not in {f["code"] for f in found}  # torch 2.5.0's SDPA default is the pin's, not the config's


def test_without_deepspeed_installed_lint_suggests_env(tmp_path):
    """A real interpreter with no site-packages: only click, packaging and yaml on the path."""
    deps = tmp_path / "deps"
    deps.mkdir()
    for module in (click, packaging, yaml):
        (deps / module.__name__).symlink_to(Path(module.__file__).parent)
    cfg, _ = _files(tmp_path)
    proc = run("lint", cfg, pythonpath=f"{SRC}:{deps}", isolated=True)
    assert proc.returncode == 1, proc.stderr  # DSC101: version unknown is a warning
    assert "DeepSpeed is not installed here" in proc.stderr and "pass --env" in proc.stderr
    assert "versions assumed: DeepSpeed, transformers, torch, accelerate, peft unknown" in proc.stdout
    assert "assumed: DeepSpeed unknown" in proc.stdout
