"""A tiny causal LM and data for the live-guard jobs (self-contained; no hub, no network)."""

from __future__ import annotations

import os
import sys

import torch
from torch.utils.data import Dataset

VOCAB, SEQ = 96, 32


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def tiny_gpt2(seed: int = 0, hidden: int = 32, layers: int = 2):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=hidden, n_layer=layers, n_head=2,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(config)


class Tokens(Dataset):
    """Deterministic sequences with a learnable pattern (next token = previous + 1 mod VOCAB)."""

    def __init__(self, n: int = 256, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        starts = torch.randint(0, VOCAB, (n, 1), generator=g)
        self.ids = (starts + torch.arange(SEQ)) % VOCAB

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = self.ids[i]
        return {"input_ids": ids, "labels": ids.clone()}


def ds_config(stage: int, *, bf16: bool = False, fp16: bool = False, ga: int = 1, micro: int = 4,
              world: int = 2, check_grad_overflow: bool | None = None, optimizer: bool = True,
              lr: float = 1e-3, initial_scale_power: int = 16) -> dict:
    config: dict = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": ga,
        "train_batch_size": micro * ga * world,
        "zero_optimization": {"stage": stage},
        "gradient_clipping": 1.0,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if optimizer:
        config["optimizer"] = {"type": "AdamW", "params": {"lr": lr, "weight_decay": 0.0}}
        config["scheduler"] = {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": lr,
                                                              "warmup_num_steps": 2, "warmup_type": "linear"}}
    if bf16:
        config["bf16"] = {"enabled": True}
        if check_grad_overflow is not None:
            config["bf16"]["check_grad_overflow"] = check_grad_overflow
    if fp16:
        config["fp16"] = {"enabled": True, "initial_scale_power": initial_scale_power, "loss_scale_window": 100,
                          "hysteresis": 2, "min_loss_scale": 1}
    return config


def hf_ds_config(stage: int, **kw) -> dict:
    """The same config with the Trainer's "auto" placeholders."""
    config = ds_config(stage, **kw)
    config["train_micro_batch_size_per_gpu"] = "auto"
    config["gradient_accumulation_steps"] = "auto"
    config["train_batch_size"] = "auto"
    config["gradient_clipping"] = "auto"
    config.pop("optimizer", None)
    config.pop("scheduler", None)
    if "bf16" in config:
        config["bf16"]["enabled"] = "auto"
    if "fp16" in config:
        config["fp16"]["enabled"] = "auto"
    return config


def reset_accelerate() -> None:
    """accelerate keeps process-wide state; reset it so the next scenario builds a fresh engine."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def run_scenarios(run) -> None:
    """`JOB.py OUT_DIR SCENARIO [SCENARIO ...]`: `run(out_dir, scenario)` for each in turn, then every rank
    leaves the process group together (a rank that exits first makes the others' teardown fail)."""
    for scenario in sys.argv[2:]:
        run(sys.argv[1], scenario)
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


COLLECTIVES: dict[str, int] = {}  # torch.distributed calls made in this process, by name


def count_collectives() -> dict[str, int]:
    """Count every call to torch.distributed's collectives from now on (DeepSpeed's communication and
    lossguard's exchange go through them), so a job can show each rank made the same ones. Returns a copy
    of the counts so far (take one before and after a scenario)."""
    import torch.distributed as dist

    for name in ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
                 "broadcast", "all_gather_object", "gather_object", "barrier", "all_to_all_single", "gather",
                 "all_gather_single", "reduce_scatter_single"):
        fn = getattr(dist, name, None)
        if fn is None or getattr(fn, "lossguard_counted", False):
            continue

        def counted(*args, _fn=fn, _name=name, **kwargs):
            COLLECTIVES[_name] = COLLECTIVES.get(_name, 0) + 1
            return _fn(*args, **kwargs)

        counted.lossguard_counted = True
        setattr(dist, name, counted)
    return dict(COLLECTIVES)


def collectives_since(before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in COLLECTIVES.items() if v - before.get(k, 0)}
