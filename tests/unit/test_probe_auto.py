"""`"auto"` in a DeepSpeed config, filled for probe's built-in job as the HF Trainer fills it
(transformers `HfTrainerDeepSpeedConfig.trainer_config_process` / `trainer_config_finalize`). Pure."""

from __future__ import annotations

import json
from pathlib import Path

from lossguard.probe.auto_values import JobSettings, fill, needed

FIXTURES = Path(__file__).parents[1] / "fixtures"


def test_auto_filled_as_the_hf_trainer_fills_it():
    """tests/fixtures/lint/llava_zero2.json's "auto" values, for the built-in job (2 ranks, hidden 32)."""
    config = json.loads((FIXTURES / "lint" / "llava_zero2.json").read_text())
    out, filled = fill(config, JobSettings(world_size=2, steps=20, hidden_size=32))
    assert filled == {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "train_batch_size": 8,
                      "fp16.enabled": False, "bf16.enabled": True, "zero_optimization.reduce_bucket_size": 1024}
    assert out["zero_optimization"]["sub_group_size"] == 1e9 and config["bf16"]["enabled"] == "auto"
    assert needed(config) == []


def test_auto_zero3_scheduler_and_optimizer_keys():
    config = {"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": "auto",
                                    "stage3_param_persistence_threshold": "auto", "reduce_bucket_size": 7},
              "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                         "weight_decay": "auto"}},
              "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                            "warmup_num_steps": "auto"}},
              "gradient_clipping": "auto"}
    out, _ = fill(config, JobSettings(hidden_size=32, steps=9))
    assert out["zero_optimization"] == {"stage": 3, "stage3_prefetch_bucket_size": 921,
                                        "stage3_param_persistence_threshold": 320, "reduce_bucket_size": 7}
    assert out["optimizer"]["params"] == {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}
    assert out["scheduler"]["params"] == {"warmup_min_lr": 0, "warmup_max_lr": 1e-3, "warmup_num_steps": 1}
    assert out["gradient_clipping"] == 1.0
    # Below ZeRO-3 the Trainer leaves the stage-3 keys "auto" (DeepSpeed accepts that there).
    below, _ = fill({"zero_optimization": {"stage": 2, "stage3_prefetch_bucket_size": "auto"}}, JobSettings())
    assert below["zero_optimization"]["stage3_prefetch_bucket_size"] == "auto"


def test_auto_the_trainer_does_not_fill_is_named():
    assert needed({"zero_optimization": {"stage": 2, "allgather_bucket_size": "auto"}, "bf16": {"enabled": "auto"}}) \
        == ["zero_optimization.allgather_bucket_size"]
