"""Every route to the DeepSpeed config a run uses: accelerate YAML (keys or deepspeed_config_file), a
LLaMA-Factory / axolotl YAML with `deepspeed:`, `--cmd` with `accelerate launch --config_file` or
`--deepspeed FILE|'{...}'`; a file with no DeepSpeed key is said to be one, never "No findings"."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lossguard.lint.api import lint_context, run_rules
from lossguard.lint.document import ConfigError, read_document
from lossguard.lint.routes import follow, from_command

SRC = str(Path(__file__).resolve().parents[3] / "src")

ACCELERATE_ZERO3 = """compute_environment: LOCAL_MACHINE
deepspeed_config:
  offload_optimizer_device: none
  offload_param_device: none
  zero3_init_flag: true
  zero3_save_16bit_model: true
  zero_stage: 3
distributed_type: DEEPSPEED
mixed_precision: bf16
num_machines: 1
num_processes: 8
"""
ACCELERATE_FILE = """distributed_type: DEEPSPEED
deepspeed_config:
  deepspeed_config_file: ds/zero2.json
  zero3_init_flag: false
num_processes: 2
"""
ZERO2_OVERLAP = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
                 "bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 2, "overlap_comm": True}}
OLD = {"deepspeed": "0.12.6", "transformers": "4.47.0", "torch": "2.1.2"}


def run(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": SRC}
    env.pop("LOSSGUARD_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "lossguard", *argv], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=120)


def _write(path: Path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def test_accelerate_keys_become_the_config_accelerate_builds(tmp_path):
    route = follow(read_document(_write(tmp_path / "acc.yaml", ACCELERATE_ZERO3)))
    zero = route.doc.data["zero_optimization"]
    assert route.synthesized and route.shown.endswith("acc.yaml")
    assert zero["stage"] == 3 and zero["stage3_gather_16bit_weights_on_model_save"] is True
    assert route.doc.data["train_micro_batch_size_per_gpu"] == "auto"
    assert route.launch == {"world_size": 8, "mixed_precision": "bf16", "zero3_save_16bit_model": True}
    # bf16 from mixed_precision reaches the rules: the bf16 ZeRO-3 finding fires as on the JSON it stands for
    ctx = lint_context(route.doc.data, {"origin": "route", "framework": "hf", **route.launch}, OLD)
    assert "DSC106" in {f.code for f in run_rules(ctx)}


def test_accelerate_config_file_followed_relative_to_the_yaml(tmp_path):
    _write(tmp_path / "cfg" / "ds" / "zero2.json", json.dumps(ZERO2_OVERLAP))
    route = follow(read_document(_write(tmp_path / "cfg" / "acc.yaml", ACCELERATE_FILE)))
    assert route.doc.source == str(tmp_path / "cfg" / "ds" / "zero2.json") and not route.synthesized
    assert route.launch == {"world_size": 2} and route.unread is None


def test_accelerate_config_file_missing_is_said_not_silent(tmp_path):
    route = follow(read_document(_write(tmp_path / "acc.yaml", ACCELERATE_FILE)))
    assert route.unread and "ds/zero2.json" in route.unread and "no such file" in route.unread
    ctx = lint_context(route.doc.data, None, OLD, options={"route_unread": route.unread})
    assert "DSC003" in {f.code for f in run_rules(ctx)}


def test_training_yaml_with_deepspeed_path_and_inline_mapping(tmp_path):
    _write(tmp_path / "ds_z2.json", json.dumps(ZERO2_OVERLAP))
    lf = _write(tmp_path / "llama3_lora_sft.yaml", "model_name_or_path: m\nstage: sft\ndeepspeed: ds_z2.json\n"
                                                   "per_device_train_batch_size: 2\ngradient_accumulation_steps: 8\n")
    route = follow(read_document(lf))
    assert route.doc.data["zero_optimization"]["overlap_comm"] is True and route.args_file == lf
    inline = _write(tmp_path / "axolotl.yaml", "base_model: m\ndeepspeed:\n  zero_optimization:\n    stage: 3\n")
    route = follow(read_document(inline))
    assert route.synthesized and route.doc.data == {"zero_optimization": {"stage": 3}}


def test_training_yaml_naming_a_missing_file_is_an_error_naming_both(tmp_path):
    lf = _write(tmp_path / "sft.yaml", "stage: sft\ndeepspeed: examples/deepspeed/ds_z3_config.json\n")
    with pytest.raises(ConfigError, match=r"sft.yaml:2: deepspeed names .*ds_z3_config.json, which cannot be read"):
        follow(read_document(lf))


def test_command_routes(tmp_path):
    ds = _write(tmp_path / "ds.json", json.dumps(ZERO2_OVERLAP))
    assert from_command({"deepspeed": ds}, None).doc.data == ZERO2_OVERLAP
    inline = from_command({"deepspeed": json.dumps(ZERO2_OVERLAP)}, None)
    assert inline.synthesized and inline.doc.data == ZERO2_OVERLAP
    acc = from_command({}, _write(tmp_path / "acc.yaml", ACCELERATE_ZERO3))
    assert acc.doc.data["zero_optimization"]["stage"] == 3
    assert from_command({"learning_rate": 1e-5}, None) is None


def test_cli_accelerate_yaml_reports_against_the_yaml(tmp_path):
    acc = _write(tmp_path / "acc.yaml", ACCELERATE_ZERO3)
    proc = run("lint", acc, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert "DSC106" in {f["code"] for f in found} and "reading accelerate YAML" in proc.stderr
    proc = run("lint", acc, "--format", "github")
    assert f"::notice file={acc.replace(':', '%3A')},title=DSC106" in proc.stdout


def test_cli_cmd_names_the_config(tmp_path):
    _write(tmp_path / "cfg" / "ds" / "zero2.json", json.dumps(ZERO2_OVERLAP))
    acc = _write(tmp_path / "cfg" / "acc.yaml", ACCELERATE_FILE)
    freeze = _write(tmp_path / "freeze.txt", "deepspeed==0.12.6\ntransformers==4.47.0\n")
    proc = run("lint", "--cmd", f"accelerate launch --config_file {acc} train.py --per_device_train_batch_size 2",
               "--env", freeze, "--format", "json")
    assert proc.returncode == 1, proc.stderr
    assert "DSC101" in {f["code"] for f in json.loads(proc.stdout)}  # the overlap_comm hang of 0.12.6
    ds = str(tmp_path / "cfg" / "ds" / "zero2.json")
    proc = run("lint", "--cmd", f"deepspeed train.py --deepspeed {ds}", "--env", freeze, "--format", "json")
    assert "DSC101" in {f["code"] for f in json.loads(proc.stdout)}
    proc = run("lint", "--cmd", f"deepspeed train.py --deepspeed '{json.dumps(ZERO2_OVERLAP)}'", "--env", freeze,
               "--format", "json")
    assert "DSC101" in {f["code"] for f in json.loads(proc.stdout)}


def test_cli_no_deepspeed_key_is_said_so(tmp_path):
    other = _write(tmp_path / "model.json", json.dumps({"hidden_size": 4096, "num_layers": 32}))
    proc = run("lint", other)
    assert proc.returncode == 2 and "no DeepSpeed key recognised" in proc.stderr and "hidden_size" in proc.stderr
    assert "Traceback" not in proc.stderr and "No findings" not in proc.stdout
    proc = run("lint")
    assert proc.returncode == 2 and "no config given" in proc.stderr
