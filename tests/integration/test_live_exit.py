"""`exit_code_on_halt`: after a halt the script ends with that status, once training has returned on every rank.

A real two-rank Trainer + DeepSpeed run under torchrun (the launcher must exit non-zero, every rank with 3, no
hang), and a plain `Guard` loop in a child process (the status, and that `finally` blocks and atexit handlers
still run). The Lightning callback's exit is tested in test_live_lightning.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lossguard.monitor.options import GuardOptions, OptionError
from lossguard.probe.launch import free_port
from tests.integration.live_helpers import JOBS, SRC

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("bad", [0, 256, -1, True, "3", 2.0])
def test_exit_code_on_halt_is_validated_with_the_bad_value(bad):
    with pytest.raises(OptionError, match=f"exit_code_on_halt must be .* got {bad!r}"):
        GuardOptions(exit_code_on_halt=bad)
    assert GuardOptions().exit_code_on_halt is None and GuardOptions(exit_code_on_halt=3).exit_code_on_halt == 3


GUARD_LOOP = textwrap.dedent("""
    import atexit, sys
    import torch
    import lossguard

    atexit.register(lambda: print("atexit handler ran", flush=True))
    poison = int(sys.argv[2])
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        with lossguard.Guard(model, optimizer, events_dir=sys.argv[1], halt_on="error", exit_code_on_halt=3) as guard:
            for step in range(1, 7):
                loss = model(torch.randn(4, 8)).pow(2).mean()
                loss = loss * float("nan") if step == poison else loss
                loss.backward()
                optimizer.step()
                guard.step(loss=loss)
                optimizer.zero_grad()
    except lossguard.LossguardHalt:
        raise AssertionError("leaving the with block must turn the halt into SystemExit(3)")
    finally:
        print("finally ran", flush=True)
    print("after the loop", flush=True)
""")


@pytest.mark.parametrize(("poison", "status"), [(3, 3), (0, 0)])
def test_guard_exits_with_the_code_after_a_halt_and_0_without(tmp_path, poison, status):
    script = tmp_path / "loop.py"
    script.write_text(GUARD_LOOP)
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "events"), str(poison)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == status, proc.stdout + proc.stderr
    assert "finally ran" in proc.stdout and "atexit handler ran" in proc.stdout
    assert ("after the loop" in proc.stdout) == (status == 0)
    assert ("lossguard: exiting with status 3 (exit_code_on_halt): the run halted at step 3" in proc.stderr) \
        == (status == 3)
    end = json.loads((tmp_path / "events" / "events-rank0.jsonl").read_text().splitlines()[-1])
    assert end["type"] == "end" and end["halted_at"] == (3 if status else None)  # written before the exit


def test_two_rank_trainer_deepspeed_halt_exits_3_on_every_rank_and_torchrun_fails(tmp_path):
    pytest.importorskip("deepspeed")
    pytest.importorskip("transformers")
    env = {**os.environ, "PYTHONPATH": str(SRC), "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    torchrun = Path(sys.executable).parent / "torchrun"
    proc = subprocess.run([str(torchrun), "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port",
                           str(free_port()), str(JOBS / "hf_exit_job.py"), str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=300)  # a hang fails here
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0, log[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks == [{"exit_code": 3, "global_step": 4, "halted_at": 4}] * 2, log[-3000:]
    assert "after train()" not in log
    assert "exitcode  : 3" in log
    assert (tmp_path / "out" / "checkpoint-4" / "trainer_state.json").exists()  # saved before the exit
    for rank in (0, 1):
        end = json.loads((tmp_path / "events" / f"events-rank{rank}.jsonl").read_text().splitlines()[-1])
        assert end["type"] == "end" and end["halted_at"] == 4


def test_another_error_leaving_the_with_block_keeps_its_own_status(tmp_path):
    """After a halt, an error raised while saving (say) is what the script reports, not the halt's status."""
    torch = pytest.importorskip("torch")
    import lossguard

    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(OSError, match="disk full"), \
            lossguard.Guard(model, optimizer, halt_on="error", console=False, exit_code_on_halt=3) as guard:
        try:
            guard.step(loss=torch.tensor(float("nan")))
        except lossguard.LossguardHalt:
            raise OSError("disk full") from None
    assert guard.monitor.halted_at == 1
    with pytest.raises(SystemExit) as exited:  # closing it the ordinary way still exits
        guard.close()
    assert exited.value.code == 3
