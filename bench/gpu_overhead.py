"""Step-time overhead and synchronizing CUDA calls of the live guard on one GPU.

    python bench/gpu_overhead.py [--steps 30] [--rounds 3]

The workload of the GPU measurements: GPT-2 124M under the HF Trainer with DeepSpeed ZeRO-2, bf16, batch
8 x 512 tokens, one rank. Arms interleaved round after round in one job (same model, data, seed): `base` (no
callback), `default` (LossguardCallback()), `print1` (fingerprint and update ratio every step), `histo` (the
wandb-style gradient-histogram anchor), `recover` (LossguardCallback(recover=True): the commit gate inside
DeepSpeed's step). Prints each arm's median step-time ratio to `base` and the
synchronizing CUDA calls per steady step, counted with `torch.cuda.set_sync_debug_mode` (the Trainer's
own included: compare each arm with `base`). Without a CUDA device it says so and exits.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ARMS = ("base", "default", "print1", "histo", "recover")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    opts = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device here: this bench measures the live guard on a GPU and has nothing to time. "
              "The CPU figure is bench/overhead.py.")
        return
    out = tempfile.mkdtemp(prefix="lossguard-gpu-bench-")
    # torchrun as a module of this interpreter: no `torchrun` script need sit beside sys.executable
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1",
                    str(HERE / "overhead.py"), "--worker", out, "--gpu",
                    "--arms", ",".join(ARMS), "--steps", str(opts.steps), "--rounds", str(opts.rounds)],
                   check=True, stdout=subprocess.DEVNULL)
    data = json.loads((Path(out) / "bench.json").read_text())
    per_round, syncs = data["median_step_s"], data["syncs_per_step"]
    print(f"model: {data['num_params'] / 1e6:.0f}M parameters, {torch.cuda.get_device_name(0)}, ZeRO-2, bf16, "
          "batch 8 x 512")
    for arm in ARMS:
        ratios = [t / b for t, b in zip(per_round[arm], per_round["base"])]
        sync = f"{statistics.median(syncs[arm]):.0f}" if syncs.get(arm) else "?"
        print(f"{arm:8s} median step {statistics.median(per_round[arm]) * 1e3:7.1f} ms   ratio to base "
              f"{statistics.median(ratios):.3f} (rounds: {', '.join(f'{r:.3f}' for r in ratios)})   "
              f"syncs per step {sync}")
    gate = [t / d for t, d in zip(per_round["recover"], per_round["default"])]
    print(f"recover / default (the commit gate under DeepSpeed): {statistics.median(gate):.3f}x (rounds: "
          f"{', '.join(f'{r:.3f}' for r in gate)}; target <= 1.01x)")


if __name__ == "__main__":
    main()
