"""`lossguard lint / rules / env` as a user runs them: real subprocesses, exit codes, every format."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[3] / "src")
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "lint"


def run(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": SRC}
    env.pop("LOSSGUARD_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "lossguard", *argv], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=120)


@pytest.fixture
def env_file(tmp_path):
    path = tmp_path / "freeze.txt"
    path.write_text("deepspeed==0.12.6\ntorch==2.1.2\ntransformers==4.37.2\n")
    return str(path)


@pytest.fixture
def clean_config(tmp_path):
    path = tmp_path / "clean.json"
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
                                "zero_optimization": {"stage": 2, "overlap_comm": False}}))
    return str(path)


def test_exit_0_clean(clean_config, env_file):
    proc = run("lint", clean_config, "--env", env_file)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no findings" in proc.stdout


def test_exit_1_and_fail_on(env_file):
    cfg = str(FIXTURES / "llava_zero2.json")
    assert run("lint", cfg, "--env", env_file).returncode == 1
    assert run("lint", cfg, "--env", env_file, "--fail-on", "never").returncode == 0
    info_only = run("lint", cfg, "--env", env_file, "--select", "DSC113")
    assert info_only.returncode == 0 and "DSC113" in info_only.stdout
    assert run("lint", cfg, "--env", env_file, "--select", "DSC113", "--fail-on", "info").returncode == 1


def test_json_format(env_file):
    proc = run("lint", str(FIXTURES / "llava_zero2.json"), "--env", env_file, "--format", "json")
    findings = json.loads(proc.stdout)
    by_code = {f["code"]: f for f in findings}
    overlap = by_code["DSC101"]
    assert set(overlap) >= {"code", "name", "severity", "message", "path", "fix"}
    assert overlap["path"] == "zero_optimization.overlap_comm" and overlap["line"] == 18
    assert overlap["fix"]["safe"] is True and "0.12.6" in overlap["message"]
    assert by_code["DSC113"]["fix"] is None


def test_sarif_and_github_formats(env_file):
    cfg = str(FIXTURES / "llava_zero2.json")
    sarif = json.loads(run("lint", cfg, "--env", env_file, "--format", "sarif").stdout)
    assert sarif["version"] == "2.1.0"
    results = sarif["runs"][0]["results"]
    assert any(r["ruleId"] == "DSC101" and r["level"] == "error" for r in results)
    rule_ids = [r["id"] for r in sarif["runs"][0]["tool"]["driver"]["rules"]]
    assert all(rule_ids[r["ruleIndex"]] == r["ruleId"] for r in results)
    gh = run("lint", cfg, "--env", env_file, "--format", "github").stdout.splitlines()
    assert any(line.startswith("::error file=") and "line=18" in line and "DSC101" in line for line in gh)


def test_select_ignore_by_name(env_file):
    cfg = str(FIXTURES / "llava_zero2.json")
    out = json.loads(run("lint", cfg, "--env", env_file, "--format", "json", "--select", "zero").stdout)
    # one finding per root cause (issue #15): the bucket size and multi-rank bucket path ride on overlap_comm
    assert [f["code"] for f in out] == ["DSC101"] and set(out[0]["also"]) == {"DSC103", "DSC104"}
    assert "Same cause: DSC104" in out[0]["message"]
    out = json.loads(run("lint", cfg, "--env", env_file, "--format", "json", "--select", "zero",
                         "--ignore", "DSC101").stdout)
    assert {f["code"] for f in out} == {"DSC103", "DSC104"}
    out = json.loads(run("lint", cfg, "--env", env_file, "--format", "json", "--ignore", "DSC1,HFA").stdout)
    assert all(not f["code"].startswith(("DSC1", "HFA")) for f in out)


@pytest.mark.parametrize(("setup", "needle"), [
    (lambda p: str(p / "missing.json"), "missing.json: no such file"),
    (lambda p: str(p), "is a directory"),
    (lambda p: (p / "bad.json").write_text('{\n  "a": 1\n  "b": 2\n}') and str(p / "bad.json"), "bad.json: line 3"),
    (lambda p: (p / "bad.yaml").write_text("a: [1,\nb: 2\n") and str(p / "bad.yaml"), "invalid YAML"),
])
def test_bad_config_exit_2(tmp_path, setup, needle):
    proc = run("lint", setup(tmp_path), "--env", os.devnull if False else str(FIXTURES / "llava.freeze"))
    assert proc.returncode == 2
    assert needle in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_training_args_bin_needs_trust_pickle(tmp_path, clean_config):
    binfile = tmp_path / "training_args.bin"
    binfile.write_bytes(b"\x80\x04N.")
    proc = run("lint", clean_config, "--training-args", str(binfile))
    assert proc.returncode == 2 and "--trust-pickle" in proc.stderr and "Traceback" not in proc.stderr


def test_bad_env_file(clean_config, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("nothing here\n")
    proc = run("lint", clean_config, "--env", str(empty))
    assert proc.returncode == 2 and "pip freeze" in proc.stderr


def test_lenient_json_warns(tmp_path, env_file):
    cfg = tmp_path / "c.json"
    cfg.write_text('{\n  // zero 2\n  "zero_optimization": {"stage": 2, "overlap_comm": false},\n}\n')
    proc = run("lint", str(cfg), "--env", env_file)
    assert proc.returncode == 0 and "not strict JSON" in proc.stderr


def test_fix_writes_in_place_and_clears(tmp_path, env_file):
    cfg = tmp_path / "zero2.json"
    cfg.write_text((FIXTURES / "llava_zero2.json").read_text())
    proc = run("lint", str(cfg), "--env", env_file, "--fix", "--format", "json")
    text = cfg.read_text()
    assert '"overlap_comm": false' in text and "applied" in proc.stderr
    assert text.splitlines()[1] == '    "fp16": {'  # indentation kept
    remaining = json.loads(proc.stdout)
    assert not [f for f in remaining if f["fix"] and f["fix"]["applicable"] and f["fix"]["safe"]]


def test_rules_and_env_commands():
    table = run("rules")
    assert table.returncode == 0 and "DSC101" in table.stdout and "zero.overlap-comm" in table.stdout
    rows = json.loads(run("rules", "--format", "json").stdout)
    assert len({r["code"] for r in rows}) == len(rows) >= 20
    env = run("env", "--no-cuda")
    assert env.returncode == 0 and "- python:" in env.stdout and "- deepspeed:" in env.stdout


def test_env_output_reads_back_as_env_file(tmp_path, clean_config):
    env_txt = tmp_path / "env.txt"
    env_txt.write_text(run("env", "--no-cuda").stdout)
    assert run("lint", clean_config, "--env", str(env_txt)).returncode in (0, 1)


def test_lint_never_imports_torch(clean_config, env_file):
    env = {**os.environ, "PYTHONPATH": SRC}
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "lossguard", "lint", clean_config, "--env", env_file],
                          capture_output=True, text=True, env=env, timeout=120)
    imported = {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines() if "|" in line}
    assert proc.returncode == 0
    assert not imported & {"torch", "deepspeed", "transformers", "rich", "numpy"}


@pytest.mark.parametrize("fmt", ["json", "sarif", "github"])
def test_machine_formats_stdout_is_only_the_report_with_deepspeed_schema(fmt, tmp_path):
    """DeepSpeed's import prints its accelerator line; with --deepspeed-schema stdout must still parse."""
    pytest.importorskip("deepspeed")
    cfg = tmp_path / "typo.json"
    cfg.write_text(json.dumps({"train_batch_size": 8, "zero_optimization": {"stage": 2, "overlap_comn": True}}))
    proc = run("lint", str(cfg), "--deepspeed-schema", "--format", fmt, "--fail-on", "never")
    assert proc.returncode == 0, proc.stderr
    if fmt == "github":
        lines = proc.stdout.splitlines()
        assert lines and all(line.startswith("::") for line in lines), proc.stdout
        assert any("DSC002" in line for line in lines)
        return
    report = json.loads(proc.stdout)
    codes = ([f["code"] for f in report] if fmt == "json"
             else [r["ruleId"] for r in report["runs"][0]["results"]])
    assert "DSC002" in codes
