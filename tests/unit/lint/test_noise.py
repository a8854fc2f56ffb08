"""Less noise, same signal (issue #15 item 6): ENV302 only under the HF Trainer, HFA202 as the possibility
it is, one finding per root cause, info findings in one line unless --show info, fixes only where they
take effect, and no memory added in the round that removes its reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from lossguard.core.findings import Severity
from lossguard.lint.api import fix_document, lint
from lossguard.lint.args import parse_command
from lossguard.lint.document import parse_text
from lossguard.lint.rules.base import fix_of

SRC = str(Path(__file__).resolve().parents[3] / "src")
OLD_HF = {"deepspeed": "0.12.6", "transformers": "4.47.0"}
MEGATRON = ("deepspeed pretrain_gpt.py --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 "
            "--micro-batch-size 4 --global-batch-size 256 --lr 1e-4 --deepspeed --deepspeed_config ds.json")


def _codes(findings):
    return {f.code: f for f in findings}


def test_env302_only_where_the_hf_trainer_runs():
    cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 8, "zero_optimization": {"stage": 1}}
    megatron = parse_command(MEGATRON)
    assert megatron["framework"] == "megatron"  # not axolotl for its micro-batch-size
    assert not {"ENV302", "DSC112", "HFA201"} & set(_codes(lint(cfg, megatron, OLD_HF)))
    assert "ENV302" not in _codes(lint(cfg, None, OLD_HF))  # nothing says the Trainer runs it
    hf = parse_command("deepspeed train.py --per_device_train_batch_size 4 --gradient_accumulation_steps 8 "
                       "--deepspeed ds.json --output_dir out")
    assert _codes(lint(cfg, hf, OLD_HF))["ENV302"].severity == Severity.WARNING
    auto = {**cfg, "gradient_accumulation_steps": "auto"}
    found = _codes(lint(auto, None, OLD_HF))["ENV302"]
    assert found.severity == Severity.INFO and "if the run accumulates" in found.message


def test_hfa202_reads_the_script_when_it_can(tmp_path):
    args = "--lora_enable True --gradient_checkpointing True --per_device_train_batch_size 1"
    calls = tmp_path / "calls.py"
    calls.write_text("model.gradient_checkpointing_enable()\nmodel.enable_input_require_grads()\n")
    plain = tmp_path / "plain.py"
    plain.write_text("model.gradient_checkpointing_enable()\ntrainer.train()\n")
    assert "HFA202" not in _codes(lint({}, parse_command(f"deepspeed {calls} {args}")))
    found = _codes(lint({}, parse_command(f"deepspeed {plain} {args}")))["HFA202"]
    assert found.severity == Severity.WARNING and "calls neither" in found.message
    unseen = _codes(lint({}, parse_command(f"deepspeed {tmp_path / 'gone.py'} {args}")))["HFA202"]
    assert unseen.severity == Severity.INFO and "if the script does not call" in unseen.message


def test_steps_per_print_fix_only_where_it_takes_effect():
    cfg = {"bf16": {"enabled": True, "check_grad_overflow": True}, "zero_optimization": {"stage": 2}}
    own = _codes(lint(cfg, None, {"deepspeed": "0.19.8"}))["DSC110"]
    assert fix_of(own).edits  # a plain DeepSpeed launch prints with steps_per_print
    hf = _codes(lint({**cfg, "steps_per_print": 10}, {"per_device_train_batch_size": 2}, {"deepspeed": "0.19.8"}))
    assert not fix_of(hf["DSC110"]).edits and "overwritten with infinity" in hf["DSC110"].message


def test_dsc105_check_grad_overflow_not_offered_on_the_bf16_optimizer_path():
    zero1 = {"bf16": {"enabled": True}, "zero_optimization": {"stage": 1}, "data_types": {"grad_accum_dtype": "fp32"}}
    assert "DSC105" not in _codes(lint(zero1, None, {"deepspeed": "0.19.8"}))
    old = _codes(lint(zero1, None, {"deepspeed": "0.18.0"}))["DSC105"]
    assert old.severity == Severity.INFO and not fix_of(old).edits and "BF16_Optimizer" in old.message
    zero2 = {**zero1, "zero_optimization": {"stage": 2}}  # ZeRO-2 ignores grad_accum_dtype: the key fix holds
    assert fix_of(_codes(lint(zero2, None, {"deepspeed": "0.18.0"}))["DSC105"]).edits


def test_unsafe_fixes_wait_for_the_safe_round():
    text = json.dumps({"zero_optimization": {"stage": 2, "overlap_comm": True, "reduce_bucket_size": "auto"}})
    doc = parse_text(text, "ds.json", "json")
    result = fix_document(doc, {"env": {"deepspeed": "0.14.0"}, "training_args": None}, unsafe=True,
                          ignore=["DSC104"])
    assert result.data["zero_optimization"]["overlap_comm"] is False
    assert result.data["zero_optimization"]["reduce_bucket_size"] == "auto"


def _run(*argv):
    env = {**os.environ, "PYTHONPATH": SRC}
    return subprocess.run([sys.executable, "-m", "lossguard", *argv], capture_output=True, text=True, env=env,
                          timeout=120)


def test_info_findings_in_one_line_unless_show_info(tmp_path):
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": "auto", "bf16": {"enabled": True},
                               "gradient_clipping": "auto",
                               "zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": True}}))
    freeze = tmp_path / "freeze.txt"
    freeze.write_text("deepspeed==0.19.8\ntorch==2.4.1\ntransformers==4.57.0\n")
    short = _run("lint", str(cfg), "--env", str(freeze))
    assert short.returncode == 0 and "DSC106 [info]" not in short.stdout
    assert "2 info findings (DSC106, DSC113); --show info lists them" in short.stdout
    full = _run("lint", str(cfg), "--show", "info", "--env", str(freeze))
    assert "DSC106 [info]" in full.stdout and "DSC113 [info]" in full.stdout
    out = json.loads(_run("lint", str(cfg), "--format", "json", "--env", str(freeze)).stdout)
    assert {f["code"] for f in out} == {"DSC106", "DSC113"}
