"""Training arguments from launch commands and framework YAML; HF-style "auto" resolution."""

from __future__ import annotations

import pytest

from lossguard.lint.args import ArgsError, load_args_file, parse_command
from lossguard.lint.resolve import resolve


def test_deepspeed_launcher():
    args = parse_command("deepspeed --num_gpus 4 --num_nodes 2 train.py --deepspeed ds.json --bf16 True "
                         "--per_device_train_batch_size=2 --gradient_checkpointing --learning_rate 1e-5")
    assert args["world_size"] == 8 and args["num_nodes"] == 2 and args["bf16"] is True
    assert args["per_device_train_batch_size"] == 2 and args["gradient_checkpointing"] is True
    assert args["learning_rate"] == 1e-5 and args["deepspeed"] == "ds.json"


def test_deepspeed_include_and_unknown_world():
    assert parse_command("deepspeed --include localhost:0,1,2 train.py")["world_size"] == 3
    assert "world_size" not in parse_command("deepspeed train.py --deepspeed ds.json")


def test_torchrun_accelerate_python():
    assert parse_command("CUDA_VISIBLE_DEVICES=0,1 torchrun --nproc_per_node=2 --nnodes 2 t.py")["world_size"] == 4
    assert parse_command("python -m torch.distributed.run --nproc-per-node 8 t.py")["world_size"] == 8
    acc = parse_command("accelerate launch --num_processes 16 --num_machines 2 --mixed_precision bf16 t.py --fp16 false")
    assert acc["world_size"] == 16 and acc["bf16"] is True and acc["fp16"] is False
    assert parse_command("python train.py --deepspeed ds.json")["world_size"] == 1


def test_llamafactory_yaml(tmp_path):
    cfg = tmp_path / "sft.yaml"
    cfg.write_text("model_name_or_path: Qwen/Qwen2-7B\nfinetuning_type: lora\ntemplate: qwen\nbf16: true\n"
                   "per_device_train_batch_size: 2\ngradient_accumulation_steps: 8\n")
    args = parse_command(f"llamafactory-cli train {cfg} learning_rate=1e-4")
    assert args["framework"] == "llamafactory" and args["lora"] is True and args["learning_rate"] == 1e-4
    assert "world_size" not in args


def test_axolotl_yaml(tmp_path):
    cfg = tmp_path / "ax.yml"
    cfg.write_text("base_model: google/gemma-2-9b\nadapter: qlora\nmicro_batch_size: 2\nfp16: true\n")
    args = load_args_file(str(cfg))
    assert args["framework"] == "axolotl" and args["model_name_or_path"] == "google/gemma-2-9b"
    assert args["per_device_train_batch_size"] == 2 and args["lora"] is True


def test_pickle_needs_trust(tmp_path):
    path = tmp_path / "training_args.bin"
    path.write_bytes(b"\x80\x04N.")
    with pytest.raises(ArgsError, match="--trust-pickle"):
        load_args_file(str(path))


def test_bad_command():
    with pytest.raises(ArgsError, match="quotes"):
        parse_command("deepspeed 'train.py")


def test_resolve_like_hf():
    config = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "train_batch_size": "auto",
              "gradient_clipping": "auto", "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"},
              "optimizer": {"params": {"lr": "auto", "betas": "auto"}},
              "scheduler": {"params": {"warmup_min_lr": "auto", "total_num_steps": "auto"}},
              "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}}
    args = {"world_size": 8, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "bf16": True,
            "model_name_or_path": "meta-llama/Llama-2-7b-hf", "origin": "t", "framework": "hf"}
    res = resolve(config, args)
    c = res.config
    assert c["train_batch_size"] == 64 and c["gradient_clipping"] == 1.0
    assert c["bf16"]["enabled"] is True and c["fp16"]["enabled"] is False
    assert c["optimizer"]["params"] == {"lr": 5e-5, "betas": [0.9, 0.999]}
    assert c["scheduler"]["params"]["warmup_min_lr"] == 0
    assert c["zero_optimization"]["reduce_bucket_size"] == 4096 * 4096
    assert ("scheduler", "params", "total_num_steps") in res.unresolved
    assert config["train_batch_size"] == "auto"  # input not mutated


def test_hidden_size_from_local_model(tmp_path):
    (tmp_path / "config.json").write_text('{"text_config": {"hidden_size": 1024}}')
    res = resolve({"zero_optimization": {"reduce_bucket_size": "auto"}},
                  {"model_name_or_path": str(tmp_path), "origin": "t", "framework": "hf"})
    assert res.config["zero_optimization"]["reduce_bucket_size"] == 1024 * 1024
