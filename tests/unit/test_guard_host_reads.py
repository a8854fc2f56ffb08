"""The live guard reads device data on the host once per optimizer step, in `monitor/dist.py`, and nowhere
else: on a GPU every other `.item()`, `.tolist()`, `.cpu()`, `float(t)` or `if t:` would stall the step
until the device caught up. On the CPU nothing stalls, but the calls are the same code path, so a real
`Guard` over a real model is run here with the tensor methods that read device data recorded: any such
call made by lossguard's own code in a steady step, outside the one sync point, fails this test."""

import contextlib
import sys
from collections import Counter
from pathlib import Path

import torch

from lossguard.monitor.guard import Guard

PACKAGE = Path(__import__("lossguard").__file__).resolve().parent
# Tensor methods that copy device data to the host (and wait for the device to get there).
HOST_READS = ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__", "__index__")


def lossguard_caller() -> str | None:
    """The innermost lossguard frame on the stack (package-relative file), if any."""
    frame = sys._getframe(2)
    while frame is not None:
        path = Path(frame.f_code.co_filename).resolve()
        if PACKAGE in path.parents:
            return str(path.relative_to(PACKAGE))
        frame = frame.f_back
    return None


@contextlib.contextmanager
def host_reads(calls: Counter):
    originals = {name: getattr(torch.Tensor, name) for name in HOST_READS}

    def recorded(name, original):
        def read(self, *args, **kwargs):
            if (where := lossguard_caller()) is not None:
                calls[(where, name)] += 1
            return original(self, *args, **kwargs)
        return read

    for name, original in originals.items():
        setattr(torch.Tensor, name, recorded(name, original))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


def test_one_host_read_per_step_and_only_at_the_sync_point(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Linear(16, 50))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    steps, per_step = 8, []
    with Guard(model, optimizer, events_dir=tmp_path, console=False, fingerprint_every=1) as guard:
        for step in range(1, steps + 1):
            for _ in range(2):  # gradient accumulation: two micro-batches per optimizer step
                ids = torch.randint(0, 50, (4, 9))
                labels = ids.clone()
                labels[:, :3] = -100
                loss = torch.nn.functional.cross_entropy(model(ids[:, :-1]).reshape(-1, 50), labels[:, 1:].reshape(-1))
                loss.backward()
                calls: Counter = Counter()
                with host_reads(calls):
                    guard.observe(loss=loss, labels=labels)
                assert not calls, f"observe read device data on the host: {dict(calls)}"
            optimizer.step()
            calls = Counter()
            with host_reads(calls):
                guard.step(step=step)
            optimizer.zero_grad()
            if step > 2:  # steady state: the first step's one-off checks are done
                per_step.append(calls)
    assert all(where == "monitor/dist.py" for calls in per_step for where, _ in calls), per_step
    assert all(calls == per_step[0] for calls in per_step) and sum(per_step[0].values()) <= 2, per_step
