"""Step-time overhead of the live guard on a two-rank ZeRO-2 Trainer run (CPU, gloo).

    python bench/overhead.py [--steps 14] [--rounds 2] [--arms base,default,recover]

Arms, interleaved round after round in one two-rank job (same model, data, seed):
  base      no callback
  default   LossguardCallback() with default options
  print1    LossguardCallback(fingerprint_every=1): fingerprint + update ratio every step
  histo     anchor: per-parameter gradient-histogram hooks in the style of wandb.watch(log="all",
            log_freq=1): torch.histc of every gradient, copied to the host, every step
  recover   LossguardCallback(recover=True): the commit gate inside DeepSpeed's `engine.step()`, the step's
            grad norm read one exchange later
Prints the median step-time ratio of each arm to `base`, and of `recover` to `default` (the gate's cost
under DeepSpeed; target <= 1.01x).

    python bench/overhead.py --recovery [--steps 30] [--rounds 3]

The recovery arm: the same model in a plain two-rank DDP loop (gloo), `lossguard.Guard` alone (`guard.step`
after `optimizer.step()`) against `Guard(recover=True)` (`if guard.commit(...): optimizer.step()`), plus the
loop without lossguard; prints the gate's median step-time ratio to the guard alone (target <= 1.01x).
The `gate` arm has snapshots off (`RecoverOptions(snapshot_every=0)`), the gate alone; the `snap` arm is the
gate with host snapshots every 10 steps (`RecoverOptions(snapshot_every=10)`, what `recover=True` picks when
the ring fits): its
ratio to the guard alone is of MEAN step times (a median would not see the one step in ten that copies),
target <= 1.05x, and it prints the host memory of one snapshot per rank.

    python bench/overhead.py --fsdp2 [--steps 30] [--rounds 3]

The FSDP2 arm: the same model under `fully_shard` (each transformer block, then the root) in a plain two-rank
loop (gloo), `lossguard.Guard` (`guard.step` after `optimizer.step()`, the norm folded from both ranks' shards)
against no guard; prints the median step-time ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ARMS = ("base", "default", "print1", "histo", "recover")
RECOVERY_ARMS = ("loop", "guard", "gate", "snap")
FSDP2_ARMS = ("none", "guard")


# The model and batch per machine kind: the CPU figure's small GPT-2, and on a GPU the workload the
# GPU measurements were taken on (GPT-2 124M, bf16, ZeRO-2, batch 8 x 512 tokens).
CPU_SHAPE = {"vocab": 16000, "seq": 64, "n_embd": 384, "n_layer": 8, "n_head": 6, "batch": 4}
GPU_SHAPE = {"vocab": 50257, "seq": 512, "n_embd": 768, "n_layer": 12, "n_head": 12, "batch": 8}


def worker(out: str, steps: int, rounds: int, gpu: bool = False, arms: tuple[str, ...] = ARMS) -> None:
    """Every arm, `rounds` times interleaved, in this process; rank 0 writes `bench.json` to `out`. On a GPU
    also the synchronizing CUDA calls per steady step (torch.cuda.set_sync_debug_mode), per arm."""
    import warnings

    import torch
    from accelerate.state import AcceleratorState, GradientState
    from torch.utils.data import Dataset
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    from lossguard import LossguardCallback

    shape = GPU_SHAPE if gpu else CPU_SHAPE
    vocab, seq = shape["vocab"], shape["seq"]

    class Data(Dataset):
        def __len__(self):
            return 10_000

        def __getitem__(self, i):
            g = torch.Generator().manual_seed(i)
            ids = torch.randint(0, vocab, (seq,), generator=g)
            return {"input_ids": ids, "labels": ids.clone()}

    class Timer(TrainerCallback):
        """Step start times; on a GPU also the synchronizing calls (warnings of the sync debug mode) of each
        step after the warm-up."""

        def __init__(self):
            self.t: list[float] = []
            self.syncs: list[int] = []
            self._caught = None

        def on_step_begin(self, args, state, control, **kw):
            if gpu:
                torch.cuda.synchronize()  # step times of the device's work, not of the queue
                if self._caught is not None:
                    self.syncs.append(sum("synchroniz" in str(w.message) for w in self._caught))
                    self._caught.clear()
                if len(self.t) == 3:  # steady state: start counting
                    self._recorder = warnings.catch_warnings(record=True)
                    self._caught = self._recorder.__enter__()
                    warnings.simplefilter("always")
                    torch.cuda.set_sync_debug_mode("warn")
            self.t.append(time.perf_counter())

        def on_train_end(self, args, state, control, **kw):
            if self._caught is not None:
                torch.cuda.set_sync_debug_mode(0)
                self._recorder.__exit__(None, None, None)

    def histo_hooks(model):
        def hook(grad):
            torch.histc(grad.detach().float(), bins=64).cpu()  # what wandb.watch(log="all") does per param

        return [p.register_hook(hook) for p in model.parameters() if p.requires_grad]

    ds = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
          "train_batch_size": "auto", "gradient_clipping": "auto", "zero_optimization": {"stage": 2},
          "steps_per_print": 10**9}
    if gpu:
        ds["bf16"] = {"enabled": True}
    results: dict[str, list[float]] = {arm: [] for arm in arms}
    syncs: dict[str, list[float]] = {arm: [] for arm in arms}
    t0 = time.perf_counter()
    for r in range(rounds):
        for arm in arms:
            torch.manual_seed(0)
            model = GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=seq, n_embd=shape["n_embd"],
                                               n_layer=shape["n_layer"], n_head=shape["n_head"]))
            timer = Timer()
            callbacks = [timer]
            if arm == "default":
                callbacks.append(LossguardCallback())
            elif arm == "print1":
                callbacks.append(LossguardCallback(fingerprint_every=1))
            elif arm == "histo":
                histo_hooks(model)
            elif arm == "recover":
                callbacks.append(LossguardCallback(recover=True))
            args = TrainingArguments(output_dir=os.path.join(out, arm), per_device_train_batch_size=shape["batch"],
                                     max_steps=steps, learning_rate=1e-4, logging_steps=10**6,
                                     save_strategy="no", report_to=[], seed=0, deepspeed=ds, use_cpu=not gpu,
                                     bf16=gpu, disable_tqdm=True)
            Trainer(model=model, args=args, train_dataset=Data(), callbacks=callbacks).train()
            steps_s = [b - a for a, b in zip(timer.t[2:], timer.t[3:])]  # skip warm-up steps
            results[arm].append(statistics.median(steps_s))
            if timer.syncs:
                syncs[arm].append(statistics.median(timer.syncs))
            if gpu:  # progress on stderr (the launcher drops the workers' stdout)
                print(f"[gpu bench] round {r + 1}/{rounds} {arm}: median step {results[arm][-1] * 1e3:.1f} ms, "
                      f"syncs/step {syncs[arm][-1] if timer.syncs else '?'}, {time.perf_counter() - t0:.0f} s in",
                      file=sys.stderr, flush=True)
            AcceleratorState._reset_state(True)
            GradientState._reset_state()
        n_params = sum(p.numel() for p in model.parameters())
    if int(os.environ.get("RANK", "0")) == 0:
        with open(os.path.join(out, "bench.json"), "w") as fh:
            json.dump({"median_step_s": results, "num_params": n_params, "syncs_per_step": syncs}, fh)


def recovery_worker(out: str, steps: int, rounds: int) -> None:
    """The recovery arms, `rounds` times interleaved, in a plain DDP loop; rank 0 writes `recovery.json`."""
    import torch
    import torch.distributed as dist
    from transformers import GPT2Config, GPT2LMHeadModel

    import lossguard

    dist.init_process_group("gloo")
    shape, rank = CPU_SHAPE, dist.get_rank()
    results: dict[str, list[float]] = {arm: [] for arm in RECOVERY_ARMS}
    means: dict[str, list[float]] = {arm: [] for arm in RECOVERY_ARMS}
    snapshot_bytes = 0
    for _ in range(rounds):
        for arm in RECOVERY_ARMS:
            torch.manual_seed(0)
            model = torch.nn.parallel.DistributedDataParallel(GPT2LMHeadModel(GPT2Config(
                vocab_size=shape["vocab"], n_positions=shape["seq"], n_embd=shape["n_embd"],
                n_layer=shape["n_layer"], n_head=shape["n_head"])))
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            # The gate alone, snapshots off (the default decides by the machine, which would mix the two).
            recover = lossguard.RecoverOptions(snapshot_every=10 if arm == "snap" else 0) if arm in ("gate", "snap") \
                else False
            guard = None if arm == "loop" else lossguard.Guard(model, optimizer, recover=recover, console=False)
            times = []
            for step in range(steps):
                ids = torch.randint(0, shape["vocab"], (shape["batch"], shape["seq"]),
                                    generator=torch.Generator().manual_seed(1000 * step + rank))
                start = time.perf_counter()
                loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
                if arm in ("gate", "snap"):
                    if guard.commit(loss=loss, labels=ids):
                        optimizer.step()
                else:
                    optimizer.step()
                    if guard is not None:
                        guard.step(loss=loss, labels=ids)
                optimizer.zero_grad()
                times.append(time.perf_counter() - start)
            if guard is not None:
                guard.close()
                if guard.ring is not None and guard.ring.ring:
                    snapshot_bytes = guard.ring.ring[-1].size
            results[arm].append(statistics.median(times[3:]))  # skip warm-up steps
            means[arm].append(statistics.fmean(times[3:]))
    if rank == 0:
        with open(os.path.join(out, "recovery.json"), "w") as fh:
            json.dump({"median_step_s": results, "mean_step_s": means, "snapshot_bytes": snapshot_bytes}, fh)
    dist.barrier()
    dist.destroy_process_group()


def fsdp2_worker(out: str, steps: int, rounds: int) -> None:
    """`FSDP2_ARMS`, `rounds` times interleaved; rank 0 writes `fsdp2.json`."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from transformers import GPT2Config, GPT2LMHeadModel

    import lossguard

    dist.init_process_group("gloo")
    shape, rank = CPU_SHAPE, dist.get_rank()
    results: dict[str, list[float]] = {arm: [] for arm in FSDP2_ARMS}
    for _ in range(rounds):
        for arm in FSDP2_ARMS:
            torch.manual_seed(0)
            model = GPT2LMHeadModel(GPT2Config(vocab_size=shape["vocab"], n_positions=shape["seq"],
                                               n_embd=shape["n_embd"], n_layer=shape["n_layer"], n_head=shape["n_head"]))
            for block in model.transformer.h:
                fully_shard(block)
            fully_shard(model)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            guard = lossguard.Guard(model, optimizer, console=False) if arm == "guard" else None
            times = []
            for step in range(steps):
                ids = torch.randint(0, shape["vocab"], (shape["batch"], shape["seq"]),
                                    generator=torch.Generator().manual_seed(1000 * step + rank))
                start = time.perf_counter()
                loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
                optimizer.step()
                if guard is not None:
                    guard.step(loss=loss, labels=ids)
                optimizer.zero_grad()
                times.append(time.perf_counter() - start)
            if guard is not None:
                guard.close()
            results[arm].append(statistics.median(times[3:]))  # skip warm-up steps
    if rank == 0:
        with open(os.path.join(out, "fsdp2.json"), "w") as fh:
            json.dump({"median_step_s": results}, fh)
    dist.barrier()
    dist.destroy_process_group()


def report_fsdp2(out: str) -> None:
    with open(os.path.join(out, "fsdp2.json")) as fh:
        per_round = json.load(fh)["median_step_s"]
    print("FSDP2 arm: fully_shard per block and root, plain loop, two ranks, gloo, CPU")
    for arm in FSDP2_ARMS:
        print(f"{arm:8s} median step {statistics.median(per_round[arm]) * 1e3:8.1f} ms")
    ratios = [g / n for g, n in zip(per_round["guard"], per_round["none"])]
    print(f"guard / none: {statistics.median(ratios):.3f}x  (rounds: {', '.join(f'{r:.3f}' for r in ratios)})")


def report_recovery(out: str) -> None:
    with open(os.path.join(out, "recovery.json")) as fh:
        data = json.load(fh)
    per_round, means = data["median_step_s"], data["mean_step_s"]
    print("recovery arm: plain DDP loop, two ranks, gloo, CPU")
    for arm in RECOVERY_ARMS:
        print(f"{arm:8s} median step {statistics.median(per_round[arm]) * 1e3:8.1f} ms")
    ratios = [g / b for g, b in zip(per_round["gate"], per_round["guard"])]
    print(f"gate / guard alone: {statistics.median(ratios):.3f}x  (rounds: {', '.join(f'{r:.3f}' for r in ratios)}; "
          "target <= 1.01x)")
    ratios = [s / g for s, g in zip(means["snap"], means["guard"])]
    print(f"snap (every 10) / guard alone, mean step: {statistics.median(ratios):.3f}x  (rounds: "
          f"{', '.join(f'{r:.3f}' for r in ratios)}; target <= 1.05x); host memory per snapshot per rank: "
          f"{data['snapshot_bytes'] / 2**20:.1f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--worker", default=None)
    parser.add_argument("--gpu", action="store_true", help="(worker) the GPU workload; see bench/gpu_overhead.py")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--recovery", action="store_true", help="the recovery arms (plain DDP loop) instead")
    parser.add_argument("--fsdp2", action="store_true", help="the FSDP2 arm (Guard vs none, fully_shard) instead")
    opts = parser.parse_args()
    if opts.worker and opts.fsdp2:
        fsdp2_worker(opts.worker, opts.steps, opts.rounds)
        return
    if opts.worker and opts.recovery:
        recovery_worker(opts.worker, opts.steps, opts.rounds)
        return
    if opts.worker:
        worker(opts.worker, opts.steps, opts.rounds, gpu=opts.gpu, arms=tuple(opts.arms.split(",")))
        return
    out = tempfile.mkdtemp(prefix="lossguard-bench-")
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    subprocess.run([torchrun, "--nproc_per_node", "2", __file__, "--worker", out, "--steps", str(opts.steps),
                    "--rounds", str(opts.rounds), "--arms", opts.arms, *(["--recovery"] if opts.recovery else []),
                    *(["--fsdp2"] if opts.fsdp2 else [])],
                   env=env, check=True, stdout=subprocess.DEVNULL)
    if opts.fsdp2:
        report_fsdp2(out)
        return
    if opts.recovery:
        report_recovery(out)
        return
    with open(os.path.join(out, "bench.json")) as fh:
        data = json.load(fh)
    per_round = data["median_step_s"]
    print(f"model: {data['num_params'] / 1e6:.1f}M parameters, two ranks, ZeRO-2, CPU")
    for arm in [a for a in ARMS if a in per_round]:
        ratios = [t / b for t, b in zip(per_round[arm], per_round["base"])]
        print(f"{arm:8s} median step {statistics.median(per_round[arm]) * 1e3:8.1f} ms   "
              f"ratio to base {statistics.median(ratios):.3f}  (rounds: {', '.join(f'{r:.3f}' for r in ratios)})")
    if "recover" in per_round and "default" in per_round:
        gate = [t / d for t, d in zip(per_round["recover"], per_round["default"])]
        print(f"recover / default (the commit gate under DeepSpeed): {statistics.median(gate):.3f}x  (rounds: "
              f"{', '.join(f'{r:.3f}' for r in gate)}; target <= 1.01x)")


if __name__ == "__main__":
    main()
