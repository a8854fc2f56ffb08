"""The live guard in a PyTorch FSDP2 loop (`fully_shard`): `lossguard.Guard` on sharded parameters.

    python examples/live_fsdp2.py                          # one process (a one-rank process group), CPU
    torchrun --nproc_per_node 2 examples/live_fsdp2.py     # two ranks over gloo, each holding half of each weight
    python examples/live_fsdp2.py --nan-at 5               # a NaN loss at step 5: halted, saved, exit status 3
    python examples/live_fsdp2.py --explode-at 5           # the learning rate explodes at step 5: the loss diverges
    lossguard watch --halt-on broken -- python examples/live_fsdp2.py --nan-at 5 --no-guard   # watch alone

The same two-layer counting model as live_raw.py, each layer sharded with `fully_shard`: every rank holds a
shard of each weight (a DTensor), the guard reads its own shard and reduces the gradient norm inside its one
per-step exchange. Each step prints `step 5 loss 3.679 grad_norm 0.5172 lr 0.01` for `analyze` and `watch`.
"""

from __future__ import annotations

import argparse
import os
import socket

import torch
import torch.distributed as dist
from live_raw import EXPLODE, SEQ, VOCAB, Counter  # the same model and data as the plain loop
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import lossguard


def start_group() -> None:
    """torchrun's process group, or a one-rank one for a plain `python` start (FSDP2 needs a mesh)."""
    if "RANK" not in os.environ:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
    dist.init_process_group("gloo")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="runs/live_fsdp2")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--nan-at", type=int, default=0, help="demo: a NaN loss at this step")
    parser.add_argument("--explode-at", type=int, default=0, help="demo: the learning rate explodes at this step")
    parser.add_argument("--no-guard", action="store_true", help="no guard (to try `lossguard watch` alone)")
    args = parser.parse_args()

    start_group()
    torch.manual_seed(0)
    model = Counter()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in (model.embed, model.head):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)  # parameters are DTensors from here on
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    guard = None if args.no_guard else lossguard.Guard(model, optimizer, events_dir=f"{args.out}/events",
                                                       halt_on="broken", exit_code_on_halt=3)
    rank0 = dist.get_rank() == 0
    try:
        for step in range(1, args.steps + 1):
            ids = (torch.randint(0, VOCAB, (8, 1)) + torch.arange(SEQ)) % VOCAB
            batch = {"input_ids": ids, "labels": ids}
            loss = model(**batch)
            if step == args.nan_at:  # demo only: a NaN loss at that step
                loss = loss * float("nan")
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # a DTensor: the sharded norm
            grad_norm = grad_norm.full_tensor()  # the whole norm (a collective every rank makes)
            if step == args.explode_at:  # demo only: from that step on, the learning rate is far too high
                for group in optimizer.param_groups:
                    group["lr"] *= EXPLODE
            optimizer.step()
            optimizer.zero_grad()
            if rank0:  # the log line (.item() waits for the device: a real loop prints every N steps)
                print(f"step {step} loss {loss.item():.5g} grad_norm {grad_norm.item():.4g} "
                      f"lr {optimizer.param_groups[0]['lr']:.4g}", flush=True)
            if guard is not None:
                guard.step(loss=loss, batch=batch, grad_norm=grad_norm)  # LossguardHalt on every rank together
    except lossguard.LossguardHalt as halt:
        # Every rank is here at the same step: gather the shards (a collective) and save on rank 0.
        state = {name: value.full_tensor() for name, value in model.state_dict().items()}
        if rank0:
            torch.save({"model": state, "step": halt.step}, f"{args.out}/halt-step{halt.step}.pt")
    if guard is not None:
        guard.close()  # exit_code_on_halt: SystemExit(3) on every rank after a halt
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
