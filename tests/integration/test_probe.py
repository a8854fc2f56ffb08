"""`lossguard probe` over real two-rank DeepSpeed jobs on CPU (gloo), launched by torchrun.

The user-style script (`probe_jobs/user_train.py`) imports no lossguard: the per-rank events prove the
auto-attach hook found its `deepspeed.initialize`. Measured tolerance: fp32 ZeRO-1/2/3 arms give bit-identical
losses and grad norms over 10 steps on this machine (max |Δloss| = 0), so the arms must agree within the
default 1e-3 + 1e-3·|loss|.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.integration
pytest.importorskip("deepspeed")

JOBS = Path(__file__).parent / "probe_jobs"
TORCHRUN = Path(sys.executable).with_name("torchrun")
LAUNCH = f"{TORCHRUN} --nproc_per_node 2 {JOBS / 'user_train.py'} --deepspeed_config {{config}}"
ENV = {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}

BF16_NO_CHECK = {"zero_optimization": {"stage": 2, "overlap_comm": False}, "gradient_clipping": 1.0,
                 "bf16": {"enabled": True, "check_grad_overflow": False}}


def write(path: Path, data) -> Path:
    path.write_text(json.dumps(data, indent=1))
    return path


def _text(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def probe_json(*args, timeout: float = 400, codes=(0, 1)):
    proc = run_cli("probe", *args, "--format", "json", timeout=timeout, env=ENV)
    assert proc.returncode in codes, proc.stderr.decode()[-3000:]
    return proc.returncode, json.loads(proc.stdout)


def by_name(report: dict) -> dict[str, dict]:
    return {arm["name"]: arm for arm in report["arms"]}


def test_user_script_inf_gradient_auto_arms(tmp_path):
    config = write(tmp_path / "ds.json", BF16_NO_CHECK)
    rc, report = probe_json(str(config), "--cmd", LAUNCH, "--report", str(tmp_path / "out"))
    arms = by_name(report)
    assert rc == 0
    base = arms["baseline"]
    assert (base["verdict"], base["signature"], base["onset_step"]) == ("dies", "nonfinite", 3)
    fix = arms["bf16.check_grad_overflow: true"]  # from lint DSC105 (known issue bf16-no-overflow-check)
    assert fix["verdict"] == "survives" and fix["changes"] == {"bf16.check_grad_overflow": True}
    assert report["recommended"]["arm"] == fix["name"]
    recommended = json.loads(Path(report["recommended"]["config_path"]).read_text())
    assert recommended["bf16"] == {"enabled": True, "check_grad_overflow": True}
    assert recommended["zero_optimization"] == BF16_NO_CHECK["zero_optimization"]
    # Observed through the auto-attach hook: the guard's per-rank records from a script with no lossguard import.
    out = tmp_path / "out"
    full = json.loads((out / "report.json").read_text())
    base_dir = Path(by_name(full)["baseline"]["dir"])
    for rank in (0, 1):
        lines = [json.loads(x) for x in (base_dir / "events" / f"events-rank{rank}.jsonl").read_text().splitlines()]
        assert lines[0]["entry"] == "deepspeed"
        steps = [x["step"] for x in lines if x.get("kind") == "train" and x.get("rank") == rank]
        assert steps == list(range(1, 9))
        assert any(x.get("code") == "LOSS001" and x.get("step") == 3 for x in lines)
    assert "baseline dies at step 3 with nonfinite" in full["verdict"]
    assert (out / "report.html").stat().st_size > 1000
    assert "bf16.check_grad_overflow: true" in (out / "report.html").read_text()


@pytest.mark.slow  # 2 arms of the tiny GPT-2: 50 s idle, 160 s on the loaded shared machine
def test_builtin_tiny_model_inf_gradient(tmp_path):
    config = write(tmp_path / "ds.json", BF16_NO_CHECK)
    arms = write(tmp_path / "arms.json", [{"name": "check", "changes": {"bf16.check_grad_overflow": True}}])
    rc, report = probe_json(str(config), "--arms", str(arms), "--workload", "bf16-nan-raw", "--steps", "9")
    assert rc == 0
    arms_out = by_name(report)
    assert (arms_out["baseline"]["verdict"], arms_out["baseline"]["signature"]) == ("dies", "nonfinite")
    assert arms_out["baseline"]["onset_step"] == 8
    assert arms_out["check"]["verdict"] == "survives"
    assert arms_out["check"]["first_disagreement_step"] == 9  # identical until the skipped step
    rec = Path(report["recommended"]["config_path"])
    assert rec == tmp_path / "ds.recommended.json"
    assert json.loads(rec.read_text())["bf16"]["check_grad_overflow"] is True


def test_zero_stages_agree_on_healthy_config(tmp_path):
    config = write(tmp_path / "fp32.json", {"zero_optimization": {"stage": 2, "overlap_comm": False},
                                            "gradient_clipping": 1.0})
    arms = _text(tmp_path / "arms.yaml",
                 "- {name: zero1, changes: {zero_optimization.stage: 1}}\n"
                 "- {name: zero3, changes: {zero_optimization.stage: 3}}\n")
    rc, report = probe_json(str(config), "--arms", str(arms), "--steps", "10",
                            "--cmd", LAUNCH + " --steps {steps} --inf-step 0")
    assert rc == 0 and report["recommended"] is None
    for arm in report["arms"]:
        assert arm["verdict"] == "survives" and arm["signature"] is None and arm["last_step"] == 10
    for arm in report["arms"][1:]:
        assert arm["first_disagreement_step"] is None
        assert arm["max_abs_dloss"] <= 1e-5 and arm["max_abs_dgrad_norm"] <= 1e-5
    assert "agree within tolerance" in report["verdict"]


def test_a_rank_aborting_at_shutdown_is_not_a_dead_arm(tmp_path):
    """Rank 1 aborts (SIGABRT) after the last asked step, as torch + gloo sometimes does at interpreter exit:
    the arms survive, and the note says the job crashed at shutdown with its exit code."""
    config = write(tmp_path / "fp32.json", {"zero_optimization": {"stage": 2}, "gradient_clipping": 1.0})
    arms = _text(tmp_path / "arms.yaml", "- {name: zero1, changes: {zero_optimization.stage: 1}}\n")
    rc, report = probe_json(str(config), "--arms", str(arms), "--steps", "4",
                            "--cmd", LAUNCH + " --steps {steps} --inf-step 0 --abort-at-exit")
    assert rc == 0
    for arm in report["arms"]:
        assert arm["verdict"] == "survives" and arm["returncode"] != 0, arm
        assert "after its last step (4): a crash at shutdown" in arm["note"], arm


@pytest.mark.slow
def test_builtin_zero_stages_agree(tmp_path):
    config = write(tmp_path / "fp32.json", {"zero_optimization": {"stage": 2}})
    arms = write(tmp_path / "arms.json", [{"name": f"zero{s}", "changes": {"zero_optimization.stage": s}}
                                          for s in (1, 3)])
    rc, report = probe_json(str(config), "--arms", str(arms), "--steps", "10", "--workload", "healthy-raw-zero0")
    assert rc == 0
    for arm in report["arms"][1:]:
        assert arm["first_disagreement_step"] is None, arm


# The issue #24 config: healthy bf16 ZeRO-2, overlap on. Its run printed "baseline dies rank-desync at step 1"
# (the job's param_sum measured against the guard's fingerprint) and wrote `steps_per_print: 10` out as the fix.
HEALTHY_BF16_ZERO2 = {"bf16": {"enabled": True}, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
                      "zero_optimization": {"stage": 2, "overlap_comm": True, "contiguous_gradients": True,
                                            "reduce_bucket_size": 500000000}}


@pytest.mark.slow  # 5 arms of the tiny GPT-2: 70 s idle
def test_builtin_healthy_bf16_zero2_no_arm_dies(tmp_path):
    config = write(tmp_path / "ds.json", HEALTHY_BF16_ZERO2)
    rc, report = probe_json(str(config))
    assert rc == 0 and report["recommended"] is None, report["verdict"]
    assert len(report["arms"]) >= 4
    for arm in report["arms"]:
        assert (arm["verdict"], arm["signature"], arm["last_step"]) == ("survives", None, 20), arm
        assert len(arm["runs"]) == 1  # nothing died: nothing repeated
    assert report["verdict"].startswith("baseline survives 20 steps; no arm dies")
    assert not (tmp_path / "ds.recommended.json").exists()


@pytest.mark.slow  # 5 arms: 90 s idle
def test_builtin_llava_auto_config_runs():
    """The README's own LLaVA ZeRO-2 config, "auto" everywhere the Trainer fills: the built-in job fills it."""
    rc, report = probe_json(str(Path(__file__).parents[1] / "fixtures" / "lint" / "llava_zero2.json"), "--steps", "6")
    base = by_name(report)["baseline"]
    assert rc == 0 and (base["verdict"], base["last_step"]) == ("survives", 6), report
    log = (Path(report["work_dir"]) / "arms" / "01-baseline" / "stdout.log").read_text()
    assert "probe: filled \"auto\" as the HF Trainer does: train_micro_batch_size_per_gpu=4" in log
    assert "zero_optimization.reduce_bucket_size=1024" in log


@pytest.mark.slow  # 2 arms that crash at start-up: 30 s idle
def test_every_arm_crashing_shows_its_error_line_and_exits_2(tmp_path):
    config = write(tmp_path / "ds.json", {"zero_optimization": {"stage": 2, "reduce_bucket_size": None}})
    arms = write(tmp_path / "arms.json", [{"name": "zero1", "changes": {"zero_optimization.stage": 1}}])
    rc, report = probe_json(str(config), "--arms", str(arms), "--steps", "3", codes=(2,))
    assert rc == 2 and report["recommended"] is None
    for arm in report["arms"]:
        assert arm["verdict"] == "dies" and arm["signature"] == "crash", arm
        assert "ValidationError" in arm["crash"] and "reduce_bucket_size" in arm["crash"], arm
        assert arm["crash"] in arm["note"] and len(arm["runs"]) == 1  # a start-up crash is not rerun
    assert report["verdict"].startswith("every arm crashed before its first step: ")
    assert "reduce_bucket_size" in report["verdict"]


def test_unfillable_auto_is_one_line_exit_2(tmp_path):
    config = write(tmp_path / "ds.json", {"zero_optimization": {"stage": 2, "allgather_bucket_size": "auto"}})
    proc = run_cli("probe", str(config), timeout=60, env=ENV)
    err = proc.stderr.decode()
    assert proc.returncode == 2 and len(err.strip().splitlines()) == 1, err
    assert 'zero_optimization.allgather_bucket_size is "auto", which the HF Trainer does not fill' in err


# -- bad input: exit 2, one line, no traceback -------------------------------------------------------------
@pytest.mark.parametrize("case", ["missing-config", "bad-arms-json", "arms-not-list", "cmd-without-config",
                                  "bad-workload"])
def test_bad_input_exit_2(tmp_path, case):
    config = write(tmp_path / "ds.json", BF16_NO_CHECK)
    args = {
        "missing-config": [str(tmp_path / "nope.json")],
        "bad-arms-json": [str(config), "--arms", str(_text(tmp_path / "a.json", "[{"))],
        "arms-not-list": [str(config), "--arms", str(_text(tmp_path / "a.json", '{"x": 1}'))],
        "cmd-without-config": [str(config), "--cmd", "torchrun train.py --deepspeed_config ds.json"],
        "bad-workload": [str(config), "--workload", "no-such"],
    }[case]
    proc = run_cli("probe", *args, timeout=60, env=ENV)
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert "Traceback" not in err
    assert err.startswith("lossguard: probe:") and len(err.strip().splitlines()) == 1
