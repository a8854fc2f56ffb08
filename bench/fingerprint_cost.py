"""What a fingerprint step costs the live guard: the weight fingerprint and the update ratios.

Builds a GPT-2-124M-shaped parameter list (148 tensors: 12 blocks of attention, MLP and layer norms, the
embeddings) and prints, for `tensors.fingerprint` and `UpdateSampler.snapshot` + `ratios`, the ATen
operators dispatched per call (on a GPU each is a kernel launch or a view) and the median time per call,
on CUDA when there is a device (synchronised around each call) and on the CPU otherwise.

    python bench/fingerprint_cost.py [--repeat 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def gpt2_shaped(device, dtype):
    import torch

    hidden, blocks = 768, 12
    shapes = [(50257, hidden), (1024, hidden)]
    for _ in range(blocks):
        shapes += [(hidden,), (hidden,), (hidden, 3 * hidden), (3 * hidden,), (hidden, hidden), (hidden,),
                   (hidden,), (hidden,), (hidden, 4 * hidden), (4 * hidden,), (4 * hidden, hidden), (hidden,)]
    shapes += [(hidden,), (hidden,)]
    model = torch.nn.Module()
    for i, shape in enumerate(shapes):
        model.register_parameter(f"p{i}", torch.nn.Parameter(torch.randn(shape, device=device, dtype=dtype)))
    return model


def main() -> None:
    sys.path.insert(0, str(ROOT / "src"))
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from lossguard.monitor import tensors

    class CountOps(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.count += 1
            return func(*args, **(kwargs or {}))

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=20)
    opts = parser.parse_args()
    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    model = gpt2_shaped(device, dtype)
    named = list(model.named_parameters())
    groups, assign = tensors.assign_groups(named, None)
    sampler = tensors.UpdateSampler(named, groups, assign, 4096)
    print(f"{len(named)} tensors, {sum(p.numel() for _, p in named) / 1e6:.0f}M parameters, {dtype}, "
          f"{torch.cuda.get_device_name(0) if cuda else 'CPU (no CUDA device here)'}")
    for name, call in (("fingerprint", lambda: tensors.fingerprint(model)),
                       ("update ratios", lambda: (sampler.snapshot(), sampler.ratios()))):
        call()
        with CountOps() as ops:
            call()
        times = []
        for _ in range(opts.repeat):
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            call()
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        print(f"{name:14s} {ops.count:5d} ATen ops per call   median {statistics.median(times) * 1e3:8.3f} ms")


if __name__ == "__main__":
    main()
