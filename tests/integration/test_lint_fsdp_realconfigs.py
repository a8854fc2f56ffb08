"""Lint over the FSDP configs public repositories ship (../shared/realconfigs/fsdp, 45 files from 14
repositories: accelerate YAML/JSON, Trainer --fsdp_config JSON, axolotl / LLaMA-Factory YAMLs, torchtitan
TOML, torchtune, llm-foundry, verl; skipped where the folder is absent): each is read as an FSDP config,
no internal error, no error finding on current releases, and each FSD rule fires on a real config with its
hazard and stays silent on its healthy twin."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lossguard.lint.api import lint_context, run_rules
from lossguard.lint.args import normalize, parse_command
from lossguard.lint.document import read_document
from lossguard.lint.routes import follow

FSDP = Path(__file__).resolve().parents[2] / ".." / "shared" / "realconfigs" / "fsdp"
pytestmark = pytest.mark.skipif(not FSDP.is_dir(), reason="../shared/realconfigs/fsdp is not here")
SRC = str(Path(__file__).resolve().parents[2] / "src")
OLD = {"transformers": "4.38.2", "accelerate": "0.28.0", "torch": "2.2.2", "peft": "0.10.0"}
NEW = {"transformers": "4.57.0", "accelerate": "1.10.0", "torch": "2.9.0", "peft": "0.17.0"}
KINDS = {"accelerate": 21, "trainer": 11, "trainer-fsdp-config": 2, "torchtitan": 4, "torchtune": 4, "composer": 2,
         "verl": 1}


def _files() -> list[Path]:
    return sorted(p for p in FSDP.iterdir() if p.name != "README.md") if FSDP.is_dir() else []


def _findings(name: str, env: dict, cmd: str | None = None) -> dict[str, str]:
    route = follow(read_document(str(FSDP / name)))
    args = normalize(read_document(str(FSDP / name)).data, name) if route.args_file else None
    if cmd:
        args = {**(args or {}), **parse_command(cmd)}
    if route.launch:
        args = {"origin": "test", "framework": "hf", **route.launch, **(args or {})}
    ctx = lint_context(route.doc.data, args, env, source=name)
    return {f.code: str(f.severity) for f in run_rules(ctx)}


def test_every_fsdp_config_is_read_as_fsdp_with_no_error_on_current_releases():
    kinds: dict[str, int] = {}
    for path in _files():
        route = follow(read_document(str(path)))
        assert route.fsdp, path.name
        kinds[route.fsdp] = kinds.get(route.fsdp, 0) + 1
        for env in (OLD, NEW):
            found = _findings(path.name, env)
            assert not [c for c in found if c.startswith("DSC")], (path.name, found)  # no DeepSpeed rule on FSDP
        assert "error" not in _findings(path.name, NEW).values(), path.name
    assert kinds == KINDS


def test_the_cli_reads_every_fsdp_config(tmp_path):
    freeze = tmp_path / "freeze.txt"
    freeze.write_text("".join(f"{k}=={v}\n" for k, v in NEW.items()))
    env = {**os.environ, "PYTHONPATH": SRC}
    for path in _files():
        proc = subprocess.run([sys.executable, "-m", "lossguard", "lint", str(path), "--env", str(freeze)],
                              capture_output=True, text=True, env=env, timeout=120)
        assert proc.returncode == 0, (path.name, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr and "reading FSDP config" in proc.stderr, path.name


TRL_CP = "huggingface__trl__examples__accelerate_configs__context_parallel_2gpu.yaml"
AXOLOTL_DBRX = "axolotl-ai-cloud__axolotl__examples__archived__dbrx__16bit-lora.yaml"
GC_ON = "accelerate launch --config_file cp.yaml sft.py --gradient_checkpointing True --output_dir out"
GC_OFF = "accelerate launch --config_file cp.yaml sft.py --gradient_checkpointing False --output_dir out"


def test_fsd101_fires_on_fsdp_activation_checkpointing_with_gradient_checkpointing():
    assert _findings(TRL_CP, NEW, GC_ON).get("FSD101") == "error"
    assert "FSD101" not in _findings(TRL_CP, NEW, GC_OFF)
    # axolotl's own dbrx example turns gradient_checkpointing off beside fsdp_activation_checkpointing
    assert "FSD101" not in _findings(AXOLOTL_DBRX, NEW)


PEFT_FSDP = "huggingface__peft__examples__sft__configs__fsdp_config.yaml"
PEFT_CMD = "accelerate launch --config_file fsdp_config.yaml train.py --use_peft_lora True --output_dir out"
AXOLOTL_QLORA = "axolotl-ai-cloud__axolotl__examples__llama-2__qlora-fsdp.yml"


def test_fsd102_fires_on_lora_with_use_orig_params_false_before_transformers_4_39():
    assert _findings(PEFT_FSDP, OLD, PEFT_CMD).get("FSD102") == "error"
    assert _findings(AXOLOTL_QLORA, OLD).get("FSD102") == "error"
    assert "FSD102" not in _findings(PEFT_FSDP, NEW, PEFT_CMD)  # PEFT's wrap policy from 4.39
    assert "FSD102" not in _findings(PEFT_FSDP, OLD, PEFT_CMD.replace("True", "False"))  # full fine-tune
    twin = "huggingface__alignment-handbook__recipes__accelerate_configs__fsdp.yaml"  # use_orig_params true
    assert "FSD102" not in _findings(twin, OLD, PEFT_CMD)
