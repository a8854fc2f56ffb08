"""Two-rank FSDP loops (gloo, CPU) with and without `lossguard.Guard` (issue 33, FSDP).

    torchrun --nproc_per_node 2 fsdp_job.py OUT_DIR SCENARIO [SCENARIO ...]

Scenario names: ENGINE-ARM. ENGINE: `fsdp2` (`fully_shard` on each layer and the root: DTensor parameters),
`fsdp1` (`FullyShardedDataParallel`, flat parameters), `fsdp1orig` (the same with `use_orig_params=True`: the
original parameters as views of each rank's shard). ARM: `plain` (no lossguard), `guard` (Guard, `step` after
the optimizer step, halt_on="error"), `recover` (Guard(recover=RecoverOptions(snapshot_every=SNAPSHOT_EVERY)), `commit`
before the step), `nan` (as
`guard`, rank 1's loss is NaN at NAN_STEP), `gradnan` (as `guard`, one element of rank 1's own gradient shard
is NaN at NAN_STEP: the loss stays finite everywhere), `holdnan` (as `recover`, rank 1's loss is NaN at NAN_STEP), `rollnan` (as `recover`, NaN written into
one element of rank 1's local shard of the head's weight after step ROLL_STEP was applied: the weights are bad
before the next step's forward), `unused` (as `guard`, with a
trainable layer the forward never uses: no rank gets a gradient for its shards).
`lightning-ARM`: the same model in Lightning's `ModelParallelStrategy` (FSDP2 through `configure_model`; its
`FSDPStrategy`, FSDP1, refuses a CPU accelerator), ARM `plain`, `guard` (LossguardLightningCallback,
halt_on="error") or `nan` (as `guard`, rank 1's loss NaN at NAN_STEP). Every arm clips at a bound no norm reaches (a no-op) to
record the norm FSDP itself computes. Every rank writes OUT_DIR/SCENARIO/rank{r}.json (losses, FSDP's norms,
the halt, the collectives it made; gated arms: the local shards of the weights and of Adam's state
before each committed step is applied, after each held one, and at the end); rank 0 writes summary.json (its findings).
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))
import recover_job  # noqa: E402
import tiny  # noqa: E402

STEPS, NAN_STEP, NO_CLIP = 8, 3, 1e9
ROLL_STEP, SNAPSHOT_EVERY = 4, 2


def build(engine: str, spare: bool = False) -> torch.nn.Module:
    """The net, sharded; `spare`: with a trainable layer the forward never uses (no gradient reaches it)."""
    torch.manual_seed(0)
    net = recover_job.Net()
    if spare:
        net.spare = torch.nn.Linear(16, 16)
    if engine == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        fully_shard(net.emb)
        fully_shard(net.head)
        return fully_shard(net)
    from torch.distributed.fsdp import FullyShardedDataParallel

    return FullyShardedDataParallel(net, use_orig_params=engine == "fsdp1orig", device_id=torch.device("cpu"))


def fsdp_norm(model: torch.nn.Module, engine: str) -> float:
    """The gradient norm as FSDP computes it (clipping at a bound no norm reaches: the gradients unchanged)."""
    if engine == "fsdp2":
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), NO_CLIP)
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    return float(model.clip_grad_norm_(NO_CLIP))


def poison_grad(model: torch.nn.Module) -> None:
    """NaN in one element of this rank's own gradient shard: no other rank's gradient sees it."""
    for param in model.parameters():
        grad = param.grad
        if grad is None:
            continue
        grad = grad.to_local() if hasattr(grad, "to_local") else grad
        if grad.numel():
            grad.view(-1)[0] = float("nan")
            return


def poison_weight(model: torch.nn.Module) -> None:
    """NaN in one element of this rank's local shard of the head's weight, in place: every logit reads it."""
    weight = model.head.weight
    with torch.no_grad():
        (weight.to_local() if hasattr(weight, "to_local") else weight).view(-1)[0] = float("nan")


def shards(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """This rank's local shards of the weights and of the optimizer's state tensors, as exact lists."""
    def mine(tensor: torch.Tensor) -> list:
        return (tensor.to_local() if hasattr(tensor, "to_local") else tensor).detach().reshape(-1).tolist()

    out = {name: mine(p) for name, p in model.named_parameters()}
    for name, p in model.named_parameters():
        for key, value in optimizer.state.get(p, {}).items():
            out[f"{name}.{key}"] = mine(value) if isinstance(value, torch.Tensor) else value
    return out


def run_lightning(work: str, arm: str) -> dict:
    """One Lightning fit under FSDP2 (ModelParallelStrategy), STEPS steps; what rank.json holds."""
    import lightning as L
    from lightning.pytorch.strategies import ModelParallelStrategy

    import lossguard

    out: dict = {"losses": [], "halted_at": None}

    class Sharded(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = recover_job.Net()

        def configure_model(self) -> None:
            from torch.distributed.fsdp import fully_shard

            fully_shard(self.net.emb)
            fully_shard(self.net.head)
            fully_shard(self.net)

        def training_step(self, batch, batch_idx):
            step = self.trainer.global_step + 1
            data = recover_job.batch_at(step, self.global_rank)
            loss = self.net(data["ids"], data["labels"])
            if arm == "nan" and step == NAN_STEP and self.global_rank == 1:
                loss = loss * float("nan")
            out["losses"].append(loss.item())
            return loss

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-2)

    guard = None if arm == "plain" else lossguard.LossguardLightningCallback(
        events_dir=os.path.join(work, "events"), halt_on="error", fingerprint_every=2)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=ModelParallelStrategy(data_parallel_size=2,
                        tensor_parallel_size=1), max_steps=STEPS, callbacks=[guard] if guard else [], logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Sharded(), torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(64)), batch_size=2))
    out["halted_at"] = guard.halted_at if guard is not None else None
    out["findings"] = [f.to_dict() for f in guard.guard.monitor._emitted] if guard is not None else []
    return out


def run(out_dir: str, name: str) -> None:
    import lossguard

    engine, arm = name.split("-")
    if engine == "lightning":
        work = os.path.join(out_dir, name)
        os.makedirs(work, exist_ok=True)
        before = tiny.count_collectives()
        out = run_lightning(work, arm)
        out["collectives"] = tiny.collectives_since(before)
        rank = dist.get_rank()
        if rank == 0:
            with open(os.path.join(work, "summary.json"), "w") as fh:
                json.dump({"findings": out.pop("findings")}, fh, default=str)
        with open(os.path.join(work, f"rank{rank}.json"), "w") as fh:
            json.dump(out, fh, default=str)
        return
    if not dist.is_initialized():
        # DETAIL: the process group checks, at every collective, that each rank makes the same call with
        # tensors of the same shape, and fails the job at the first that differs (instead of a hang)
        os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    work = os.path.join(out_dir, name)
    os.makedirs(work, exist_ok=True)
    model = build(engine, spare=arm == "unused")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    before = tiny.count_collectives()
    gated = arm in ("recover", "holdnan", "rollnan")
    recover = lossguard.RecoverOptions(snapshot_every=SNAPSHOT_EVERY) if gated else None
    guard = None if arm == "plain" else lossguard.Guard(
        model, optimizer, events_dir=os.path.join(work, "events"), console=rank == 0, fingerprint_every=2,
        recover=recover if gated else False, **({} if gated else {"halt_on": "error"}))
    out: dict = {"losses": [], "norms": [], "commits": [], "halted_at": None, "before": {}, "after_hold": {}}
    try:
        for step in range(1, STEPS + 1):
            batch = recover_job.batch_at(step, rank)
            loss = model(batch["ids"], batch["labels"])
            if arm in ("nan", "holdnan") and step == NAN_STEP and rank == 1:
                loss = loss * float("nan")
            loss.backward()
            if arm == "gradnan" and step == NAN_STEP and rank == 1:
                poison_grad(model)
            out["losses"].append(loss.item())
            out["norms"].append(fsdp_norm(model, engine))
            ok = guard.commit(loss=loss, labels=batch["labels"]) if gated else True
            out["commits"].append(ok)
            if ok:
                if arm == "rollnan":  # the state a snapshot taken at this commit holds
                    out["before"][step] = shards(model, optimizer)
                optimizer.step()
                if arm == "rollnan" and step == ROLL_STEP and rank == 1:
                    poison_weight(model)
            else:  # what the guard did to the held gradients
                out["grads_dropped"] = all(p.grad is None for p in model.parameters())
                if arm == "rollnan":
                    out["after_hold"][step] = shards(model, optimizer)
            if guard is not None and not gated:
                guard.step(loss=loss, labels=batch["labels"])
            optimizer.zero_grad()
    except lossguard.LossguardHalt as halt:
        out["halted_at"] = halt.step
    if guard is not None:
        guard.close()
    out["collectives"] = tiny.collectives_since(before)
    if engine == "fsdp2" and arm in ("plain", "recover"):
        out["final"] = shards(model, optimizer)
    if rank == 0:
        findings = [f.to_dict() for f in guard.monitor._emitted] if guard is not None else []
        with open(os.path.join(work, "summary.json"), "w") as fh:
            json.dump({"findings": findings}, fh, default=str)
    with open(os.path.join(work, f"rank{rank}.json"), "w") as fh:
        json.dump(out, fh)


if __name__ == "__main__":
    tiny.run_scenarios(run)
