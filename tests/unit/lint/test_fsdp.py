"""The FSDP reader (lint/fsdp.py) as a table of real shapes, the routes that reach it, and bad input: a wrong
type or unreadable file is exit 2 naming the file and key, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lossguard.lint.api import fsdp_view, lint
from lossguard.lint.document import ConfigError, parse_text
from lossguard.lint.fsdp import kind_of, read_view
from lossguard.lint.routes import follow, open_route

SRC = str(Path(__file__).resolve().parents[3] / "src")
HF_DUMP = {"output_dir": "out", "fsdp": [], "fsdp_config": {"min_num_params": 0, "xla": False}, "deepspeed": None}

READS = [  # (config, kind, values expected)
    ({"distributed_type": "FSDP", "mixed_precision": "bf16",
      "fsdp_config": {"fsdp_use_orig_params": "false", "fsdp_version": 2, "fsdp_sharding_strategy": "full_shard"}},
     "accelerate", {"use_orig_params": False, "version": 2, "sharding_strategy": "FULL_SHARD", "mixed_precision": "bf16"}),
    ({"fsdp": "full_shard offload auto_wrap", "fsdp_config": {"activation_checkpointing": "true"}},
     "trainer", {"options": ["full_shard", "offload", "auto_wrap"], "offload_params": True,
                 "activation_checkpointing": True}),
    ({"base_model": "m", "fsdp_version": 2, "fsdp_config": {"offload_params": True}}, "trainer",
     {"version": 2, "offload_params": True}),
    ({"base_model": "m", "fsdp_config": {"fsdp_version": 2, "activation_checkpointing": True}}, "trainer",
     {"version": 2, "activation_checkpointing": True}),
    ({"fsdp_sharding_strategy": "SHARD_GRAD_OP", "fsdp_use_orig_params": True}, "trainer-fsdp-config",
     {"sharding_strategy": "SHARD_GRAD_OP", "use_orig_params": True}),
    ({"parallelism": {"data_parallel_shard_degree": -1}, "training": {"max_norm": 1.0}}, "torchtitan", {"version": 2}),
    ({"fsdp_cpu_offload": True, "model": {"_component_": "torchtune.models.llama3.llama3_70b"}}, "torchtune",
     {"version": 2}),
]


@pytest.mark.parametrize(("config", "kind", "values"), READS, ids=[r[1] + str(i) for i, r in enumerate(READS)])
def test_reader_table(config, kind, values):
    view = read_view(config, "cfg")
    assert view is not None and view.kind == kind
    assert {k: view.values.get(k) for k in values} == values


@pytest.mark.parametrize("config", [HF_DUMP, {"zero_optimization": {"stage": 2}}, {"fsdp": ""}, {}])
def test_not_fsdp(config):
    assert kind_of(config) is None
    assert fsdp_view(config, None) is None


def test_the_trainers_fsdp_arguments_without_a_config():
    args = {"origin": "--cmd", "fsdp": "full_shard auto_wrap", "fsdp_config": {"activation_checkpointing": True},
            "gradient_checkpointing": True, "output_dir": "o"}
    found = lint({}, args, {"transformers": "4.46.0"}, select=["FSD"])
    assert [f.code for f in found] == ["FSD101"]


@pytest.mark.parametrize(("config", "key"), [
    ({"distributed_type": "FSDP", "fsdp_config": {"fsdp_use_orig_params": "maybe"}}, "fsdp_config.fsdp_use_orig_params"),
    ({"distributed_type": "FSDP", "fsdp_config": [1]}, "fsdp_config"),
    ({"distributed_type": "FSDP", "fsdp_config": {"fsdp_version": 3}}, "fsdp_config.fsdp_version"),
    ({"fsdp": ["full_shard", "zero3"]}, "'zero3'"),
    ({"fsdp": 7}, "fsdp = 7"),
])
def test_wrong_types_name_the_key(config, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        read_view(config, "cfg.yaml")


def test_analyze_and_probe_refuse_an_fsdp_config(tmp_path):
    path = tmp_path / "fsdp.yaml"
    path.write_text("distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n")
    with pytest.raises(ConfigError, match="FSDP config"):
        open_route(str(path))
    assert open_route(str(path), allow_fsdp=True).fsdp == "accelerate"


def test_a_deepspeed_route_is_unchanged():
    doc = parse_text(json.dumps({"zero_optimization": {"stage": 2}}), "ds.json", "json")
    assert follow(doc).fsdp is None


def _cli(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": SRC}
    env.pop("LOSSGUARD_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "lossguard", "lint", *argv], capture_output=True, text=True,
                          env=env, timeout=120)


@pytest.mark.parametrize(("name", "text", "said"), [
    ("bad.yaml", "distributed_type: FSDP\nfsdp_config:\n  fsdp_offload_params: often\n", "fsdp_offload_params = 'often'"),
    ("bad.toml", "[training\nmax_norm = 1.0\n", "invalid TOML"),
    ("bad2.yaml", "distributed_type: FSDP\nfsdp_config: [1\n", "invalid YAML"),
])
def test_bad_input_is_exit_2_with_one_line(tmp_path, name, text, said):
    path = tmp_path / name
    path.write_text(text)
    proc = _cli(str(path))
    assert proc.returncode == 2, proc.stderr
    assert said in proc.stderr and str(path) in proc.stderr and "Traceback" not in proc.stderr


def test_cli_trainer_fsdp_in_the_command(tmp_path):
    config = tmp_path / "fsdp.json"
    config.write_text(json.dumps({"fsdp_activation_checkpointing": True}))
    freeze = tmp_path / "freeze.txt"
    freeze.write_text("transformers==4.46.0\n")
    cmd = f"torchrun --nproc_per_node 8 train.py --fsdp 'full_shard auto_wrap' --fsdp_config {config} " \
          "--gradient_checkpointing True --output_dir out"
    proc = _cli("--cmd", cmd, "--env", str(freeze), "--format", "json")
    assert proc.returncode == 1 and [f["code"] for f in json.loads(proc.stdout) if f["severity"] == "error"] == ["FSD101"]
    bad = _cli("--cmd", "torchrun train.py --fsdp 'full_shard zero3' --output_dir out", "--env", str(freeze))
    assert bad.returncode == 2 and "'zero3'" in bad.stderr and "Traceback" not in bad.stderr


def test_inline_fsdp_config_in_a_command():
    from lossguard.lint.args import parse_command

    args = parse_command("""torchrun train.py --fsdp full_shard --fsdp_config '{"activation_checkpointing": true}' """
                         "--gradient_checkpointing True --output_dir o")
    assert fsdp_view({}, args).get("activation_checkpointing") is True
    with pytest.raises(ConfigError, match="not valid JSON"):
        fsdp_view({}, {**args, "fsdp_config": "{oops"})
