"""`lossguard analyze` on the hand-written excerpts (formats this machine cannot produce)."""

import json

import pytest

from lossguard.api import analyze
from lossguard.cli.options import load_known_facts
from tests.conftest import FIXTURES

EXCERPTS = FIXTURES / "excerpts"

CASES = {
    # file: (verdict, signature, onset step, top cause or None)
    "hf4_llava_overlap.log": ("broken", "nonfinite-hidden", 5, "zero12-overlap-race"),
    "hf4_sentinel_nan.log": ("broken", "nonfinite-hidden", 40, None),
    "multinode_duplicates.log": ("healthy", None, None, None),
    "megatron.log": ("healthy", None, None, None),
    "mmengine.log": ("broken", "nonfinite", 40, None),
    "swift_logging.jsonl": ("broken", "masked-labels", 15, "template-mismatch"),
    "llamafactory_trainer_log.jsonl": ("broken", "lr-zero", 10, None),
    "fp16_overflow_v100.log": ("broken", "fp16-overflow", 2, "fp16-activation-overflow"),
    "lora_no_grad.log": ("broken", "no-grad-flow", 1, "lora-reentrant-checkpointing"),
    "healthy_hf5.log": ("healthy", None, None, None),
}


@pytest.mark.parametrize("name", list(CASES))
def test_excerpt_verdict_signature_onset(name):
    verdict, signature, onset, top_cause = CASES[name]
    d = analyze([EXCERPTS / name])
    assert (d.verdict, d.signature, d.onset_step) == (verdict, signature, onset)
    if top_cause:
        assert d.causes[0].id == top_cause


def test_multinode_log_counts_each_step_once():
    d = analyze([EXCERPTS / "multinode_duplicates.log"])
    assert d.result.stats.num_train == 3
    assert d.result.facts.deepspeed_version == "0.14.0"


def test_llava_log_reveals_its_config_and_ranks_the_overlap_race_first():
    d = analyze([EXCERPTS / "hf4_llava_overlap.log"])
    facts = d.result.facts
    assert (facts.deepspeed_version, facts.zero_stage, facts.overlap_comm, facts.bf16, facts.world_size) == \
        ("0.12.6", 2, True, True, 8)
    assert "overlap_comm" in d.causes[0].fix
    assert any("0.12.6" in line for line in d.causes[0].evidence)


def test_user_supplied_config_and_env_join_the_diagnosis(tmp_path):
    # A log with no config dump: the ranking comes from --config and --env alone.
    log = tmp_path / "run.log"
    log.write_text("".join(f"{{'loss': {2 - i / 10}, 'grad_norm': 1.5, 'epoch': {i}}}\n" for i in range(3)) +
                   "{'loss': 0.0, 'grad_norm': nan, 'epoch': 3}\n" * 3)
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"zero_optimization": {"stage": 2, "overlap_comm": True}, "bf16": {"enabled": True}}))
    env = tmp_path / "freeze.txt"
    env.write_text("deepspeed==0.12.6\ntorch==2.1.2\ntransformers==4.37.2\n")
    d = analyze([log], facts=load_known_facts(str(config), str(env)))
    assert d.signature == "nonfinite-hidden" and d.causes[0].id == "zero12-overlap-race"
    without = analyze([log])
    assert without.causes[0].confidence < d.causes[0].confidence or without.causes[0].id != d.causes[0].id
    # With overlap_comm off the race drops out of first place.
    config.write_text(json.dumps({"zero_optimization": {"stage": 2, "overlap_comm": False}, "bf16": {"enabled": True}}))
    off = analyze([log], facts=load_known_facts(str(config), str(env)))
    assert off.causes[0].id != "zero12-overlap-race"


def test_generic_csv_with_a_step_column(tmp_path):
    csv = tmp_path / "metrics.csv"
    csv.write_text("step,train/loss,learning_rate,grad_norm\n" +
                   "".join(f"{i},{2.0 - i / 100},1e-4,{1.5 + i / 100}\n" for i in range(1, 6)) +
                   "".join(f"{i},nan,1e-4,nan\n" for i in range(6, 9)))
    d = analyze([csv])
    assert (d.verdict, d.signature, d.onset_step) == ("broken", "nonfinite", 6)


def test_output_dir_with_checkpoints_reads_the_latest_state_only(tmp_path):
    rows = [{"step": i, "loss": 2.0 - i / 100, "grad_norm": 1.5, "learning_rate": 1e-4} for i in range(1, 11)]
    dead = [{"step": i, "loss": 0.0, "grad_norm": 1.4142135623730951, "learning_rate": 1e-4} for i in range(11, 16)]
    for number, history in ((5, rows[:5]), (10, rows), (15, rows + dead)):
        ckpt = tmp_path / f"checkpoint-{number}"
        ckpt.mkdir()
        (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": number, "log_history": history}))
        (ckpt / "model.safetensors").write_bytes(b"\x00" * 64)
    d = analyze([tmp_path])
    assert d.result.stats.num_train == 15  # the other checkpoints hold prefixes of the same history
    assert (d.signature, d.onset_step) == ("nonfinite-hidden", 11)
