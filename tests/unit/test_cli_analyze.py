"""The analyze CLI as a user runs it: real subprocesses, exit codes 0/1/2, JSON contract, bad input."""

import json

from tests.conftest import FIXTURES

EXCERPTS = FIXTURES / "excerpts"


def test_json_contract_and_exit_1_on_a_dead_run(cli):
    proc = cli("analyze", EXCERPTS / "hf4_llava_overlap.log", "--format", "json")
    assert proc.returncode == 1, proc.stderr
    out = json.loads(proc.stdout)
    assert {"verdict", "signature", "onset_step", "causes", "findings"} <= set(out)
    assert out["verdict"] == "broken" and out["signature"] == "nonfinite-hidden" and out["onset_step"] == 5
    assert {"id", "confidence", "evidence", "fix"} <= set(out["causes"][0])
    assert {"code", "severity", "step", "message"} <= set(out["findings"][0])


def test_healthy_exit_0_and_fail_on_never(cli):
    assert cli("analyze", EXCERPTS / "healthy_hf5.log").returncode == 0
    assert cli("analyze", EXCERPTS / "lora_no_grad.log", "--fail-on", "never").returncode == 0


def test_human_report_puts_the_verdict_first(cli):
    proc = cli("analyze", EXCERPTS / "hf4_llava_overlap.log", env={"COLUMNS": "160"})
    lines = proc.stdout.decode().splitlines()
    assert "BROKEN" in lines[0] and "nonfinite-hidden since step 5" in lines[0]
    assert "overlap_comm" in proc.stdout.decode()


def test_stdin(cli):
    text = (EXCERPTS / "lora_no_grad.log").read_bytes()
    proc = cli("analyze", "-", "--format", "json", stdin=text)
    assert json.loads(proc.stdout)["signature"] == "no-grad-flow"


def _bad(proc, *needles):
    err = proc.stderr.decode()
    assert proc.returncode == 2, (proc.returncode, err)
    assert "Traceback" not in err and err.count("\n") <= 2, err
    for needle in needles:
        assert needle in err, err


def test_bad_inputs_get_one_clear_line_and_exit_2(cli, tmp_path):
    _bad(cli("analyze", tmp_path / "missing.log"), "missing.log", "no such file")
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    _bad(cli("analyze", empty), "empty.log")
    binary = tmp_path / "model.safetensors.bin"
    binary.write_bytes(bytes(range(256)) * 100)
    _bad(cli("analyze", binary), "model.safetensors.bin")
    truncated = tmp_path / "trainer_state.json"
    # Cut before its first complete entry (one cut later is read: test_text_source.py).
    truncated.write_text('{"log_history": [{"loss": 0.')
    _bad(cli("analyze", truncated), "trainer_state.json", "line 1")
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "notes.md").write_text("# nothing")
    _bad(cli("analyze", tmp_path / "dir"), "no training log found")
    prose = tmp_path / "prose.txt"
    prose.write_text("hello\nworld\n")
    _bad(cli("analyze", prose), "no training metrics")
    _bad(cli("analyze", "-", stdin=b""), "-: no training metrics")
    _bad(cli("analyze", EXCERPTS / "healthy_hf5.log", "--config", tmp_path / "nope.json"), "nope.json")
    bad_json = tmp_path / "ds.json"
    bad_json.write_text('{"zero_optimization": {"stage": 2,,}}')
    _bad(cli("analyze", EXCERPTS / "healthy_hf5.log", "--config", bad_json), "ds.json", "line 1")


def test_explain_every_listed_topic(cli):
    listing = cli("explain").stdout.decode().splitlines()
    topics = [line.split()[0] for line in listing]
    assert "nonfinite-hidden" in topics and "LOSS002" in topics
    proc = cli("explain", "nonfinite-hidden")
    assert proc.returncode == 0 and b"zero12-overlap-race" in proc.stdout
    _bad(cli("explain", "no-such-thing"), "no-such-thing")


def test_help_lists_commands(cli):
    out = cli("--help").stdout.decode()
    assert "analyze" in out and "explain" in out


def test_a_huge_single_line_is_read_with_bounded_memory(cli, tmp_path):
    big = tmp_path / "runaway.log"
    with open(big, "wb") as out:
        out.write(b"{'loss': 2.0, 'epoch': 0.1}\n")
        out.write(b"{'loss': " + b"9" * (40 << 20) + b"}\n")  # a 40 MB line
        out.write(b"{'loss': 1.9, 'epoch': 0.2}\n")
    proc = cli("analyze", big, "--format", "json")
    assert proc.returncode in (0, 1), proc.stderr
    out = json.loads(proc.stdout)
    assert out["stats"]["train_logs"] >= 2


def test_a_log_that_crashed_before_any_metric_says_so(cli, tmp_path):
    log = tmp_path / "stdout.log"
    log.write_text("[INFO] [config.py:988:print]   zero_config .................. stage=2 overlap_comm=False\n"
                   "[rank0]: Traceback (most recent call last):\n"
                   '[rank0]:   File "train.py", line 3, in <module>\n'
                   "[rank0]: IndexError: list index out of range\n")
    _bad(cli("analyze", log), "crashed before logging any training metric", "IndexError: list index out of range")


def test_facts_alone_are_not_a_healthy_run(cli, tmp_path):
    log = tmp_path / "banner.log"
    log.write_text("[Rank 0] DeepSpeed info: version=0.14.0, git-hash=unknown, git-branch=unknown\n")
    _bad(cli("analyze", log), "no training metrics")
