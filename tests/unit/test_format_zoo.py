"""`lossguard analyze` on excerpts of every log shape people fine-tune LLMs / VLMs with (tests/fixtures/excerpts/
formats/, one file per tool, shape and condition; its README names the source each line shape follows).

Each case is a mechanism of a reader or a detector, never a number of one file: the verdict and the primary
signature a careful expert accepts (several where the log cannot tell them apart, as in the real-log labels),
and the onset step where the log shows it.
"""

import pytest

from lossguard.api import analyze
from lossguard.core.records import EVAL, EVENT, TRAIN
from lossguard.sources.text_log import parse_lines
from tests.conftest import FIXTURES

ZOO = FIXTURES / "excerpts" / "formats"
ANY = None
DEAD_ZERO = ("nonfinite-hidden", "zero-loss", "masked-labels")

CASES = {
    # file: (verdict, accepted signatures or ANY, onset step or ANY)
    "accelerate_logger_step_colon_healthy.log": ("healthy", ANY, ANY),
    "ansi_colour_dicts_nan_broken.log": ("broken", ("nonfinite",), 5),
    "colossalai_tqdm_epoch_healthy.log": ("healthy", ANY, ANY),
    "crlf_hf_dicts_healthy.log": ("healthy", ANY, ANY),
    "csv_step_loss_lr_healthy.csv": ("healthy", ANY, ANY),
    "custom_print_epoch_step_loss_healthy.log": ("healthy", ANY, ANY),
    "custom_timestamp_lr0_broken.log": ("broken", ("lr-zero", "not-learning"), 20),
    "deepspeed_chat_step1_healthy.log": ("healthy", ANY, ANY),
    "deepspeed_nodeprefix_dicts_healthy.log": ("healthy", ANY, ANY),
    "deepspeed_pdsh_hostprefix_scale_min_broken.log": ("broken", ("fp16-overflow",), ANY),
    "deepspeed_step_lines_all_skipped_broken.log": ("broken", ("fp16-overflow", "lr-zero"), 10),
    "fairseq_json_healthy.log": ("healthy", ANY, ANY),
    "fairseq_simple_minscale_broken.log": ("broken", ("fp16-overflow",), ANY),
    "hf440_dicts_loss0_gradnan_broken.log": ("broken", ("nonfinite-hidden",), 2),
    "hf440_dicts_tensor_gradnorm_healthy.log": ("healthy", ANY, ANY),
    "hf440_tqdm_dicts_healthy.log": ("healthy", ANY, ANY),
    "hf5_rankprefix_string_dicts_healthy.log": ("healthy", ANY, ANY),
    "hf_notebook_table_tabs_healthy.log": ("healthy", ANY, ANY),
    "jsonl_metrics_nan_broken.jsonl": ("broken", ("nonfinite",), 70),
    "lightning_rich_nan_broken.log": ("broken", ("nonfinite",), 100),
    "lightning_tqdm_postfix_healthy.log": ("healthy", ANY, ANY),
    "litgpt_lora_healthy.log": ("healthy", ANY, ANY),
    "litgpt_lora_nan_broken.log": ("broken", ("nonfinite",), 5),
    "mlxlm_cliui_table_healthy.log": ("healthy", ANY, ANY),
    "mlxlm_cliui_table_nan_broken.log": ("broken", ("nonfinite",), 40),
    "mlxlm_iter_lines_healthy.log": ("healthy", ANY, ANY),
    "msswift_dicts_loss0_gradnan_broken.log": ("broken", ("nonfinite-hidden",), 10),
    "nanotron_iteration_healthy.log": ("healthy", ANY, ANY),
    "torchrun_rankprefix_interleaved_healthy.log": ("healthy", ANY, ANY),
    "torchtune_disklogger_healthy.log": ("healthy", ANY, ANY),
    "torchtune_disklogger_nan_broken.log": ("broken", ("nonfinite",), 4),
    "torchtune_pbar_cr_nan_broken.log": ("broken", ("nonfinite",), 5),
    "tqdm_postfix_loss_lr_healthy.log": ("healthy", ANY, ANY),
    "trl_dpo_dicts_healthy.log": ("healthy", ANY, ANY),
    "trl_grpo_t5strings_loss0_start_healthy.log": ("healthy", ANY, ANY),
    "trl_grpo_dicts_zero_advantage_broken.log": ("broken", ("no-grad-flow", "not-learning", "zero-loss"), 1),
    "unsloth_notebook_table_loss0_broken.log": ("broken", DEAD_ZERO, 3),
    "wandb_run_summary_healthy.log": ("healthy", ANY, ANY),
    "wandb_run_summary_loss0_gradnan_broken.log": ("broken", ("nonfinite", "nonfinite-hidden"), ANY),
    "xtuner_mmengine_lr0_gradnorm0_broken.log": ("broken", ("no-grad-flow", "lr-zero"), 10),
    "torchtitan_ansi_nan_broken.log": ("broken", ("nonfinite",), 12),
    "verl_grpo_healthy.log": ("healthy", ANY, ANY),
    "verl_grpo_nan_broken.log": ("broken", ("nonfinite",), 9),
    "olmo_console_nan_broken.log": ("broken", ("nonfinite",), 8),
    "composer_console_batches_healthy.log": ("healthy", ANY, ANY),
    "maxtext_completed_step_nan_broken.log": ("broken", ("nonfinite",), 9),
    "nanogpt_iter_and_eval_lines_healthy.log": ("healthy", ANY, ANY),
    "run-tensorboard_export_healthy-tag-train_loss.csv": ("healthy", ANY, ANY),
    "openrlhf_ppo_tqdm_postfix_healthy.log": ("healthy", ANY, ANY),
    "keras_progbar_nan_broken.log": ("broken", ("nonfinite",), 200),
    "llamafactory_dicts_gradnan_flat_broken.log": ("broken", ("nonfinite", "not-learning"), ANY),
    "megatron_core_all_skipped_broken.log": ("broken", ("fp16-overflow", "lr-zero"), ANY),
    "deepspeed_pdsh_overflow_only_broken.log": ("broken", ("fp16-overflow",), 1),
    "github_details_quoted_hf_dicts_healthy.log": ("healthy", ANY, ANY),
    "github_wrapped_cut_dicts_loss0_gradnan_broken.log": ("broken", ("nonfinite-hidden",), 4),
    "hf_train_eval_metrics_blocks_healthy.log": ("healthy", ANY, ANY),
    "hf_dicts_nan_then_train_metrics_broken.log": ("broken", ("nonfinite",), 7),
    "trainer_state_log_history_pasted_healthy.log": ("healthy", ANY, ANY),
    "trainer_state_log_history_fenced_loss0_gradnan_broken.txt": ("broken", ("nonfinite-hidden",), 20),
    "trainer_state_entries_one_per_line_healthy.log": ("healthy", ANY, ANY),
    "peft_accelerate_epoch_ppl_tensor_healthy.log": ("healthy", ANY, ANY),
    "peft_accelerate_epoch_ppl_tensor_nan_broken.log": ("broken", ("nonfinite",), 3),
    "msswift3_token_acc_dicts_healthy.log": ("healthy", ANY, ANY),
    "llamafactory_info_prefix_dicts_healthy.log": ("healthy", ANY, ANY),
    "torchelastic_default_rank_prefix_nan_broken.log": ("broken", ("nonfinite",), 6),
}


def test_every_excerpt_has_a_case_and_a_readme_line():
    files = {p.name for p in ZOO.iterdir() if p.name != "README.md"}
    assert files == set(CASES)
    readme = (ZOO / "README.md").read_text()
    assert [name for name in sorted(files) if f"`{name}`" not in readme] == []


@pytest.mark.parametrize("name", sorted(CASES))
def test_format_zoo_verdict_signature_onset(name):
    verdict, signatures, onset = CASES[name]
    d = analyze([ZOO / name])
    assert d.verdict == verdict, (d.verdict, d.signature, d.onset_step)
    if verdict == "healthy":
        return
    assert signatures is ANY or d.signature in signatures, d.signature
    assert onset is ANY or d.onset_step == onset, d.onset_step


def test_litgpt_reads_every_iteration_and_the_validation_loss_as_an_eval():
    # `iter 9 step 2 | loss train: 1.54`: the iteration is the step (no two lines merged into one), and
    # `iter 8: val loss 1.64` is the eval loss, not a training loss.
    d = analyze([ZOO / "litgpt_lora_healthy.log"])
    assert (d.result.stats.num_train, d.result.stats.num_eval) == (12, 1)


def test_fairseq_json_lines_take_num_updates_as_the_step_and_valid_loss_as_an_eval():
    records = list(parse_lines((ZOO / "fairseq_json_healthy.log").read_bytes().splitlines()))
    assert [r.step for r in records if r.kind == TRAIN] == list(range(200, 1401, 200))
    assert [(r.step, r.signals["eval_loss"]) for r in records if r.kind == EVAL] == [(1400, 6.512)]
    assert not any(r.step_is_ordinal for r in records)


def test_a_sentinel_looking_norm_beside_an_rl_loss_of_zero_is_not_a_hidden_nan():
    # transformers 5 prints a GRPO norm of 0.99996 as '1' beside the loss '0' (beta * KL at the start).
    d = analyze([ZOO / "trl_grpo_t5strings_loss0_start_healthy.log"])
    assert [f.signature for f in d.result.findings if f.signature == "nonfinite-hidden"] == []


def test_nanogpt_eval_line_gives_the_val_loss_as_an_eval_not_a_training_loss():
    records = list(parse_lines((ZOO / "nanogpt_iter_and_eval_lines_healthy.log").read_bytes().splitlines()))
    assert [(r.step, r.signals["eval_loss"]) for r in records if r.kind == EVAL] == [(0, 4.25), (20, 3.25), (40, 2.25)]
    assert all(r.signals["loss"] < 4.3 for r in records if r.kind == TRAIN)


def test_a_tensorboard_csv_export_takes_its_signal_from_the_file_name():
    d = analyze([ZOO / "run-tensorboard_export_healthy-tag-train_loss.csv"])
    assert d.result.stats.num_train == 10


def _records(name):
    return list(parse_lines((ZOO / name).read_bytes().splitlines()))


def test_a_run_summary_is_not_a_step():
    # wandb's summary gives the last step's values at its `train/global_step`; HF's `train_loss` there is the
    # run's average: an event, never one more loss after the last step.
    records = _records("wandb_run_summary_healthy.log")
    assert [(r.step, r.signals["loss"]) for r in records if r.kind == TRAIN] == [(900, 1.2241)]
    assert [r.data for r in records if r.kind == EVENT and r.event == "train-summary"] == [{"loss": 1.48811}]


def test_deepspeed_chat_perplexity_line_after_its_evaluation_header_is_an_eval():
    records = _records("deepspeed_chat_step1_healthy.log")
    assert [r.signals.get("eval_loss") for r in records if r.kind == EVAL] == [1.7601, 1.4354]
    assert not any("loss" in r.signals for r in records if r.kind == TRAIN)


def test_an_epoch_written_e_of_n_counts_from_one():
    # ColossalAI's `Epoch [1/3]` with `20/200` iterations: the first epoch's steps are 20..200, not 220..400.
    records = _records("colossalai_tqdm_epoch_healthy.log")
    assert [r.step for r in records if r.kind == TRAIN] == list(range(20, 201, 20))
    zero_based = b"Epoch [0/3]: 10%| | 20/200 [00:04<00:36, 5.01it/s, loss=2.6]\rEpoch [1/3]: 10%| | 20/200 [00:04<00:36, 5.01it/s, loss=2.5]"
    assert [r.step for r in parse_lines([zero_based])] == [20, 220]


def test_overflows_before_any_step_number_count_the_steps():
    # Only OVERFLOW lines, two hosts printing each: the n-th halving is step n, another host's copy of it
    # is the same step, so the storm has an onset.
    steps = [r.step for r in _records("deepspeed_pdsh_overflow_only_broken.log") if r.event == "overflow"]
    assert steps[:6] == [1, 1, 2, 2, 3, 3]
    d = analyze([ZOO / "deepspeed_pdsh_overflow_only_broken.log"])
    assert d.onset_step == 1


def test_nanogpt_eval_time_train_estimate_is_not_a_second_training_record():
    records = _records("nanogpt_iter_and_eval_lines_healthy.log")
    train = [(r.step, r.signals["loss"]) for r in records if r.kind == TRAIN]
    assert train == [(0, 4.21), (10, 3.71), (20, 3.21), (30, 2.71), (40, 2.21)]


def test_a_dict_wrapped_over_two_lines_is_one_log():
    # The terminal wrapped `{'loss': 0.0, 'grad_norm': ` / `nan, 'learning_rate': ...}`: one record with the
    # value from the next line, not a loss record and an lr record at two steps.
    d = analyze([ZOO / "github_wrapped_cut_dicts_loss0_gradnan_broken.log"])
    assert d.result.stats.num_train == 10
    records = _records("github_wrapped_cut_dicts_loss0_gradnan_broken.log")
    assert records[0].signals == {"loss": 1.87, "grad_norm": 0.91, "lr": 9.98e-05, "epoch": 0.02}
    # Wrapped inside a number, over three lines: the joined value stands, not the first line's `1.2`.
    (record,) = parse_lines([b"{'loss': 1.2", b"345, 'grad_norm': 0.5, 'learning_r", b"ate': 1e-05, 'epoch': 0.1}"])
    assert record.signals == {"loss": 1.2345, "grad_norm": 0.5, "lr": 1e-05, "epoch": 0.1}


def test_a_pasted_log_history_reads_one_record_per_entry():
    # Pretty-printed entries (`"loss": 2.3,` then `"step": 10` on lines of their own), in a fence or cut.
    for name, steps in (("trainer_state_log_history_pasted_healthy.log", list(range(25, 201, 25))),
                        ("trainer_state_log_history_fenced_loss0_gradnan_broken.txt", list(range(5, 41, 5)))):
        d = analyze([ZOO / name])
        assert d.result.stats.num_train == len(steps), name
        assert (d.result.stats.first_step, d.result.stats.last_step) == (steps[0], steps[-1]), name


def test_hf_metrics_blocks_are_summaries_and_evals_not_steps():
    records = _records("hf_train_eval_metrics_blocks_healthy.log")
    assert [r.step for r in records if r.kind == TRAIN] == list(range(1, 11))
    assert [r.event for r in records if r.kind == EVENT] == ["train-summary", "train-summary"]
    assert [(r.step, r.signals["eval_loss"]) for r in records if r.kind == EVAL] == [(10, 0.7702)]
