"""A user's own raw-DeepSpeed training script, as found in the wild: no lossguard import anywhere.

    torchrun --nproc_per_node 2 user_train.py --deepspeed_config ds.json [--steps 8] [--inf-step 3]

A tiny next-token model over fixed random data (seed 0, same order in every run). At `--inf-step` rank 0
multiplies its loss by inf: one non-finite gradient, which bf16 ZeRO-2 with `check_grad_overflow: false`
feeds into Adam. Rank 0 prints `step N loss X grad_norm Y`, the plain line such scripts print.
"""

import argparse
import json
import math
import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

VOCAB, DIM, LENGTH, MICRO_BATCH = 32, 16, 12, 4


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.mix = nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.GELU(), nn.Linear(2 * DIM, DIM))
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, input_ids, labels):
        hidden = self.embed(input_ids)
        logits = self.head(hidden + self.mix(hidden))
        return nn.functional.cross_entropy(logits.float().view(-1, VOCAB), labels.reshape(-1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--deepspeed_config", required=True)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--inf-step", type=int, default=3)
    parser.add_argument("--abort-at-exit", action="store_true")
    args = parser.parse_args()
    with open(args.deepspeed_config) as f:
        config = json.load(f)
    config.update(train_micro_batch_size_per_gpu=MICRO_BATCH, gradient_accumulation_steps=1)
    config.pop("train_batch_size", None)
    config.setdefault("optimizer", {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}})

    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    torch.manual_seed(0)
    model = TinyLM()
    engine, _, _, _ = deepspeed.initialize(model=model, config=config, model_parameters=model.parameters())
    data = torch.randint(0, VOCAB, (64, LENGTH + 1), generator=torch.Generator().manual_seed(0))
    for step in range(1, args.steps + 1):
        start = ((step - 1) * world + rank) * MICRO_BATCH % len(data)
        batch = data[start:start + MICRO_BATCH]
        loss = engine(input_ids=batch[:, :-1], labels=batch[:, 1:])
        if step == args.inf_step and rank == 0:
            loss = loss * math.inf
        engine.backward(loss)
        engine.step()
        grad_norm = engine.get_global_grad_norm()
        if rank == 0:
            print(f"step {step} loss {loss.item():.5g} grad_norm {float(grad_norm):.5g}", flush=True)
    # A well-behaved script closes its process group. Left to interpreter exit, torch 2.13 + gloo on CPU now
    # and then aborts a rank after the last step ("terminate called without an active exception").
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    if args.abort_at_exit and rank == 1:
        os.abort()  # a rank dying at shutdown, after the training itself finished


if __name__ == "__main__":
    main()
