"""One DeepSpeed-config reader: lint, `analyze --config` and the log's config dump parse a value the same way."""

import json

import pytest

from lossguard.core.dsconfig import DeepSpeedConfig, as_bool, as_int
from lossguard.core.facts import RunFacts, facts_from_ds_config
from lossguard.lint.context import LintContext
from lossguard.sources.readers.ds_facts import facts_from_line

WRITTEN = [
    ({"zero_optimization": {"stage": "2", "overlap_comm": "true"}}, 2, True),
    ({"zero_optimization": {"stage": 2.0, "overlap_comm": "False"}}, 2, False),
    ({"zero_optimization": {"stage": 3}}, 3, True),  # DeepSpeed's default overlap for ZeRO-3
    ({"zero_optimization": {"stage": 1}}, 1, False),  # ... and for ZeRO-1/2
    ({"zero_optimization": {"stage": "auto"}}, None, None),
    ({"zero_optimization": {"stage": "two"}}, None, None),
    ({}, 0, False),
]


@pytest.mark.parametrize(("config", "stage", "overlap"), WRITTEN)
def test_lint_and_analyze_read_the_same_stage_and_overlap(config, stage, overlap):
    ctx = LintContext(config)
    facts = facts_from_ds_config(config, "ds.json")
    assert (ctx.zero_stage, ctx.overlap_comm) == (stage, overlap)
    assert (facts.zero_stage, facts.overlap_comm) == (stage, overlap)


def test_string_numbers_and_bools_parse_like_deepspeed_does():
    assert as_int("2") == 2 and as_int(2.0) == 2 and as_int("2.5") is None and as_int(True) is None
    assert as_bool("FALSE") is False and as_bool(" true ") is True and as_bool("auto") is None
    ds = DeepSpeedConfig.of({"zero_optimization": {"reduce_bucket_size": "5e8"}, "bfloat16": {"enabled": True}})
    assert ds.reduce_bucket_size == 500_000_000 and ds.precision_written("bf16") is True
    assert DeepSpeedConfig.of("not a dict").zero_stage == 0


def test_auto_and_absent_precision_stay_unknown_in_facts():
    facts = facts_from_ds_config({"bf16": {"enabled": "auto"}}, "ds.json")
    assert facts.bf16 is None and facts.fp16 is None
    assert facts_from_ds_config({"fp16": {"enabled": "true"}}, "ds.json").fp16 is True


def test_a_default_yields_to_what_the_log_states():
    """The config file leaves overlap_comm out (DeepSpeed default false); the run's own dump says True."""
    facts = RunFacts()
    facts.merge(facts_from_ds_config({"zero_optimization": {"stage": 2}}, "ds.json"))
    assert facts.overlap_comm is False and facts.origin["overlap_comm"] == "ds.json (DeepSpeed default)"
    facts.set("overlap_comm", True, "train.log")
    facts.set("zero_stage", 3, "train.log")  # a written value is not replaced
    assert (facts.overlap_comm, facts.zero_stage) == (True, 2)


def test_the_log_dump_uses_the_same_parsers():
    line = b"[INFO] [config.py:1000:print]   zero_config .................. stage=2 overlap_comm=True " \
           b"contiguous_gradients=False reduce_bucket_size=200000000 use_multi_rank_bucket_allreduce=True"
    assert facts_from_line(line) == {"zero_stage": 2, "overlap_comm": True, "contiguous_gradients": False,
                                     "reduce_bucket_size": 200000000, "use_multi_rank_bucket_allreduce": True}
    assert facts_from_line(b"[INFO]   bfloat16_config .............. enabled=True check_grad_overflow=False") \
        == {"bf16": True, "check_grad_overflow": False}
    assert facts_from_line(b"[INFO]   communication_data_type ...... torch.float32") == \
        {"communication_data_type": "fp32"}


def test_analyze_config_reads_a_string_stage_as_zero2(cli, tmp_path):
    """Issue #13: `"stage": "2"` was ZeRO-2 to lint and unknown to `analyze --config`."""
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"zero_optimization": {"stage": "2", "overlap_comm": "true"}}))
    log = tmp_path / "train.log"
    log.write_text("".join(f"{{'loss': 0.0, 'grad_norm': 1.0, 'learning_rate': 1e-05, 'epoch': {i / 10}}}\n"
                           for i in range(1, 12)))
    out = json.loads(cli("analyze", log, "--config", config, "--format", "json").stdout)
    assert out["facts"]["zero_stage"] == 2 and out["facts"]["overlap_comm"] is True
