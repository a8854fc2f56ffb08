"""`lossguard demo` end to end, as the README's first command runs it: real two-rank DeepSpeed runs."""

import json

from tests.conftest import run_cli


def test_demo_catches_the_death_the_fix_is_healthy_and_recovery_finishes_the_run(tmp_path):
    proc = run_cli("demo", "--out", tmp_path, timeout=400, env={"COLUMNS": "200"})
    out = proc.stdout.decode()
    assert proc.returncode == 0, out[-3000:] + proc.stderr.decode()[-2000:]
    assert "lossguard stopped the job at step 8 on every rank" in out
    assert "BROKEN" in out and "check_grad_overflow" in out
    assert "fixed run: HEALTHY" in out
    # the fourth act: the same dying run with recover=True holds step 8 on every rank and finishes, and says so
    assert "step   8  >>> lossguard held the step on every rank: nonfinite on rank(s) 0" in out
    assert "recovered run: finished, verdict WARNING" in out and "held: step 8 (held)" in out
    recovered = [json.loads(line) for line in (tmp_path / "recovered" / "events" / "events-rank0.jsonl").read_text()
                 .splitlines() if '"recovery"' in line]
    assert [(r["step"], r["kind"]) for r in recovered] == [(8, "held")]
    # What the demo says is on disk: the halt checkpoint, both runs' live events, the report.
    assert (tmp_path / "dying" / "checkpoint-8").is_dir()
    halts = [json.loads(line) for line in (tmp_path / "dying" / "events" / "events-rank1.jsonl").read_text().splitlines()
             if '"halt"' in line]
    assert halts and halts[0]["step"] == 8
    assert (tmp_path / "report.html").stat().st_size > 10_000


def test_demo_list_and_bad_scenario():
    listing = run_cli("demo", "--list")
    assert listing.returncode == 0 and b"bf16-nan" in listing.stdout
    bad = run_cli("demo", "--scenario", "nope")
    assert bad.returncode == 2 and b"nope" in bad.stderr and b"Traceback" not in bad.stderr
