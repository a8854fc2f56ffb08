"""Config on every route (issue #23, item 5): `analyze --config` and `probe` read an accelerate YAML, a
LLaMA-Factory / axolotl YAML and the DeepSpeed JSON they name through the resolver `lint` uses, and every
fact cites where it was written. Inputs are real configs (tests/fixtures/config_routes/README.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lossguard.api import analyze
from lossguard.core.facts import RunFacts
from lossguard.lint.document import ConfigError
from lossguard.lint.routes import open_route
from lossguard.lint.run_config import launch_config, route_facts
from tests.conftest import FIXTURES, ROOT

ROUTES = FIXTURES / "config_routes"
ACC = ROUTES / "accelerate"
ACC_ZERO2 = ACC / "config_yaml_templates" / "deepspeed_zero2.yaml"
OPEN_INSTRUCT = ROUTES / "open_instruct"
LF_TRAIN = Path("examples") / "train_lora" / "llama3_lora_sft_ds2.yaml"  # run from the LLaMA-Factory root
AXOLOTL_TRAIN = Path("examples") / "lora-8b-ds2.yml"  # run from the axolotl root
NAN_LOG = FIXTURES / "excerpts" / "hf4_sentinel_nan.log"  # no config dump: the facts come from --config


def facts_of(path: Path | str) -> RunFacts:
    return route_facts(open_route(str(path)))


def line_of(path: Path, needle: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


def cli(*argv: object, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "200"}
    env.pop("LOSSGUARD_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "lossguard", *map(str, argv)], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=120)


def one_clear_line(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") <= 2, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


# -- the resolver and the facts it yields ------------------------------------------------------------------

def test_accelerate_yaml_naming_a_zero2_json_gives_its_facts_with_lines():
    facts = facts_of(ACC_ZERO2)
    json_file = ACC / "deepspeed_config_templates" / "zero_stage2_config.json"
    assert (facts.zero_stage, facts.overlap_comm, facts.fp16, facts.world_size) == (2, True, True, 2)
    stage_line = line_of(json_file, '"stage"')
    assert facts.origin["zero_stage"] == f"zero_stage2_config.json:{stage_line}"
    assert facts.origin["overlap_comm"] == f"zero_stage2_config.json:{line_of(json_file, 'overlap_comm')}"
    assert facts.origin["world_size"] == f"deepspeed_zero2.yaml:{line_of(ACC_ZERO2, 'num_processes')}"
    assert facts.origin["use_multi_rank_bucket_allreduce"] == "zero_stage2_config.json (DeepSpeed default)"


def test_real_accelerate_yamls_follow_their_json_relative_to_the_yaml(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing relative to the working directory helps: the YAML's folder does
    assert facts_of(ACC / "config_yaml_templates" / "deepspeed.yaml").zero_stage == 1
    sp = facts_of(ACC / "alst_ulysses_sequence_parallelism" / "sp-alst.accelerate-config.yml")
    assert (sp.zero_stage, sp.bf16, sp.world_size) == (3, True, 4)
    assert sp.overlap_comm is True and sp.origin["overlap_comm"] == "sp-alst.ds-config.json (DeepSpeed default)"


def test_inline_accelerate_keys_map_to_deepspeed_facts_cited_at_the_yaml_line():
    yaml = OPEN_INSTRUCT / "deepspeed_zero2.yaml"
    facts = facts_of(yaml)
    assert (facts.zero_stage, facts.offload_optimizer, facts.bf16, facts.fp16) == (2, False, True, False)
    assert facts.overlap_comm is False  # accelerate writes no overlap_comm: DeepSpeed's ZeRO-2 default
    assert facts.world_size == 8
    assert facts.origin["zero_stage"] == f"deepspeed_zero2.yaml:{line_of(yaml, 'zero_stage')}"
    assert facts.origin["offload_optimizer"] == f"deepspeed_zero2.yaml:{line_of(yaml, 'offload_optimizer_device')}"
    assert facts.origin["bf16"] == f"deepspeed_zero2.yaml:{line_of(yaml, 'mixed_precision')}"
    assert facts.origin["overlap_comm"] == "deepspeed_zero2.yaml (DeepSpeed default)"
    zero3 = facts_of(OPEN_INSTRUCT / "deepspeed_zero3.yaml")
    assert (zero3.zero_stage, zero3.overlap_comm) == (3, True)


def test_an_accelerate_default_yields_to_what_the_log_states(tmp_path):
    """zero_stage left out: accelerate's plugin builds ZeRO-2, said as its default; the run's dump wins."""
    yaml = tmp_path / "acc.yaml"
    yaml.write_text("distributed_type: DEEPSPEED\ndeepspeed_config:\n  offload_optimizer_device: cpu\n")
    facts = facts_of(yaml)
    assert facts.zero_stage == 2 and facts.origin["zero_stage"] == "acc.yaml (accelerate default)"
    assert facts.offload_optimizer is True and facts.origin["offload_optimizer"] == "acc.yaml:3"
    facts.set("zero_stage", 3, "train.log:9")
    facts.set("offload_optimizer", False, "train.log:9")
    assert (facts.zero_stage, facts.offload_optimizer) == (3, True)


def test_llama_factory_yaml_names_its_json_relative_to_the_launch_directory(monkeypatch):
    monkeypatch.chdir(ROUTES / "llama_factory")
    facts = facts_of(LF_TRAIN)
    json_file = ROUTES / "llama_factory" / "examples" / "deepspeed" / "ds_z2_config.json"
    assert (facts.zero_stage, facts.overlap_comm) == (2, False)
    assert facts.origin["overlap_comm"] == f"ds_z2_config.json:{line_of(json_file, 'overlap_comm')}"
    # The JSON leaves bf16 and GA to the Trainer ("auto"); the YAML, its arguments, fills them
    assert (facts.bf16, facts.gradient_accumulation_steps) == (True, 2)
    assert facts.origin["bf16"] == f"llama3_lora_sft_ds2.yaml:{line_of(ROUTES / 'llama_factory' / LF_TRAIN, 'bf16')}"


def test_auto_stays_unknown(monkeypatch):
    """axolotl writes `bf16: auto` and its JSON `"enabled": "auto"`: unknown, neither False nor 0."""
    monkeypatch.chdir(ROUTES / "axolotl")
    facts = facts_of(AXOLOTL_TRAIN)
    assert (facts.zero_stage, facts.overlap_comm, facts.offload_optimizer) == (2, True, True)
    assert facts.bf16 is None and facts.fp16 is None and "bf16" not in facts.known()
    assert facts.reduce_bucket_size == 500_000_000 and facts.gradient_accumulation_steps == 4
    assert facts.gradient_checkpointing is True


def test_unreadable_routes_are_one_line_naming_file_key_and_next_step(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    missing = tmp_path / "acc.yaml"
    missing.write_text("distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: ds/zero2.json\n")
    with pytest.raises(ConfigError, match=r"acc.yaml:3: deepspeed_config.deepspeed_config_file names ds/zero2.json"
                                          r", which cannot be read: no such file .*fix the path"):
        open_route(str(missing))
    with pytest.raises(ConfigError, match=r"llama3_lora_sft_ds2.yaml:11: deepspeed names examples/deepspeed/"
                                          r"ds_z2_config.json, which cannot be read"):
        open_route(str(ROUTES / "llama_factory" / LF_TRAIN))  # from the wrong directory
    broken = tmp_path / "broken.yaml"
    broken.write_text("deepspeed_config:\n  zero_stage: [2\n")
    with pytest.raises(ConfigError, match=r"broken.yaml: line \d+ column \d+: invalid YAML"):
        open_route(str(broken))
    plain = tmp_path / "args.yaml"
    plain.write_text("learning_rate: 1.0e-5\n")
    with pytest.raises(ConfigError, match="no DeepSpeed key recognised"):
        open_route(str(plain))


def test_given_facts_keep_their_locations_through_analysis():
    """The engine hands the caller's facts to the detectors as an event; their origins must survive it."""
    diagnosis = analyze([NAN_LOG], facts=facts_of(ACC_ZERO2))
    origin = diagnosis.result.facts.origin
    assert origin["zero_stage"].startswith("zero_stage2_config.json:") and origin["world_size"].endswith(":12")


# -- analyze --config, as a user runs it ---------------------------------------------------------------------

def test_analyze_config_accelerate_yaml_reports_zero2_and_overlap():
    proc = cli("analyze", NAN_LOG, "--config", ACC_ZERO2, "--format", "json")
    assert proc.returncode == 1, proc.stderr
    out = json.loads(proc.stdout)
    assert out["facts"]["zero_stage"] == 2 and out["facts"]["overlap_comm"] is True
    assert "reading accelerate YAML" in proc.stderr and "zero_stage2_config.json" in proc.stderr
    race = next(c for c in out["causes"] if c["id"] == "zero12-overlap-race")  # not lowered by "stage 0"
    assert any("[zero_stage2_config.json:" in line and "overlap_comm" in line for line in race["evidence"])
    human = cli("analyze", NAN_LOG, "--config", ACC_ZERO2)
    run_line = next(line for line in human.stdout.splitlines() if line.startswith("run:"))
    assert "zero_stage=2" in run_line and "overlap_comm=True" in run_line


def test_analyze_config_inline_accelerate_and_llama_factory_yaml():
    out = json.loads(cli("analyze", NAN_LOG, "--config", OPEN_INSTRUCT / "deepspeed_zero2.yaml",
                         "--format", "json").stdout)
    assert out["facts"]["zero_stage"] == 2 and out["facts"]["bf16"] is True
    proc = cli("analyze", NAN_LOG, "--config", LF_TRAIN, "--format", "json", cwd=ROUTES / "llama_factory")
    facts = json.loads(proc.stdout)["facts"]
    assert (facts["zero_stage"], facts["overlap_comm"], facts["bf16"]) == (2, False, True), proc.stderr


def test_analyze_config_bad_routes_exit_2_with_one_line(tmp_path):
    missing = tmp_path / "acc.yaml"
    missing.write_text("distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: nope.json\n")
    one_clear_line(cli("analyze", NAN_LOG, "--config", missing),
                   "acc.yaml:3: deepspeed_config.deepspeed_config_file names nope.json", "fix the path")
    broken = tmp_path / "acc2.yaml"
    broken.write_text("distributed_type: DEEPSPEED\ndeepspeed_config: {zero_stage: 2\n")
    one_clear_line(cli("analyze", NAN_LOG, "--config", broken), "acc2.yaml", "invalid YAML")
    one_clear_line(cli("analyze", NAN_LOG, "--config", ROUTES / "llama_factory" / LF_TRAIN, cwd=tmp_path),
                   "deepspeed names examples/deepspeed/ds_z2_config.json")


# -- probe ---------------------------------------------------------------------------------------------------

def test_probe_starts_from_the_deepspeed_dict_the_yaml_resolves_to():
    from lossguard.probe.api import load_inputs

    cmd = "sh run.sh {config}"  # a shell script: probe does not inspect its interpreter
    json_file = ACC / "deepspeed_config_templates" / "zero_stage2_config.json"
    config, arms = load_inputs(ACC_ZERO2, cmd=cmd)
    assert config == json.loads(json_file.read_text())
    assert {"zero_optimization.overlap_comm": False} in [arm.changes for arm in arms]
    # accelerate's keys build the config; mixed_precision: bf16 fills precision as accelerate does at launch
    config, _ = load_inputs(OPEN_INSTRUCT / "deepspeed_zero2.yaml", cmd=cmd)
    assert config["zero_optimization"]["stage"] == 2
    assert config["bf16"] == {"enabled": True} and config["fp16"] == {"enabled": False}


def test_launch_config_fills_only_auto_precision(tmp_path):
    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 2}, "bf16": {"enabled": "auto"},
                                                  "fp16": {"enabled": False, "loss_scale": 0}}))
    yaml = tmp_path / "acc.yaml"
    yaml.write_text("distributed_type: DEEPSPEED\nmixed_precision: bf16\n"
                    "deepspeed_config:\n  deepspeed_config_file: ds.json\n")
    route = open_route(str(yaml))
    assert launch_config(route)["bf16"] == {"enabled": True}
    assert launch_config(route)["fp16"] == {"enabled": False, "loss_scale": 0}
    assert route.doc.data["bf16"] == {"enabled": "auto"}  # the route's own document is left as read


def test_probe_cli_bad_route_exit_2(tmp_path):
    missing = tmp_path / "acc.yaml"
    missing.write_text("distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: nope.json\n")
    one_clear_line(cli("probe", missing, "--cmd", "sh run.sh {config}"),
                   "probe: ", "acc.yaml:3: deepspeed_config.deepspeed_config_file names nope.json")
