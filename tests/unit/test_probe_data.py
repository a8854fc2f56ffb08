"""The zoo's data pipeline masks labels for real: a template mismatch leaves nothing supervised."""

from __future__ import annotations

from lossguard.probe.data import (
    IGNORE_INDEX,
    CharTokenizer,
    build_dataset,
    count_supervised,
    make_conversations,
    preprocess,
)


def _supervised_text(sample, tokenizer):
    return tokenizer.decode([t for t in sample["labels"] if t != IGNORE_INDEX])


def test_correct_template_supervises_exactly_the_answers():
    tokenizer = CharTokenizer()
    turns = [("copy abc", "abc"), ("reverse xyz", "zyx")]
    sample = preprocess(turns, tokenizer, template="chatml", log=lambda _m: None)
    assert _supervised_text(sample, tokenizer) == "abc</s>zyx</s>"
    assert sample["labels"][0] == IGNORE_INDEX  # BOS


def test_template_mismatch_masks_every_label_and_warns_like_llava():
    tokenizer = CharTokenizer()
    messages = []
    sample = preprocess([("copy abc", "abc")], tokenizer, template="chatml", mask_template="vicuna_v1",
                        log=messages.append)
    assert all(t == IGNORE_INDEX for t in sample["labels"])
    assert len(sample["labels"]) == len(sample["input_ids"]) == 16
    assert messages == ["WARNING: tokenization mismatch: 1 vs. 16. (ignored)"]


def test_mismatched_dataset_has_no_supervised_token_at_all():
    messages = []
    data = build_dataset(32, mask_template="vicuna_v1", log=messages.append)
    assert sum(count_supervised(s) for s in data) == 0
    assert len(messages) == 32


def test_matched_dataset_supervises_every_sample():
    data = build_dataset(32, log=lambda _m: None)
    assert all(count_supervised(s) >= 4 for s in data)  # >= 3 answer chars + </s>


def test_truncation_can_cut_every_answer_without_a_warning():
    messages = []
    data = build_dataset(32, max_length=10, log=messages.append)
    assert all(len(s["input_ids"]) == 10 for s in data)
    assert sum(count_supervised(s) for s in data) == 0
    assert messages == []  # LLaVA skips the mismatch warning when the sample was truncated


def test_data_is_deterministic():
    assert make_conversations(8, seed=3) == make_conversations(8, seed=3)
    assert make_conversations(8, seed=3) != make_conversations(8, seed=4)


def test_tokenizer_round_trips_special_tokens():
    tokenizer = CharTokenizer()
    text = "<|user|>copy ab<|end|><|assistant|>ab</s>"
    ids = tokenizer.encode(text, add_bos=False)
    assert tokenizer.decode(ids) == text
    assert len(ids) == 1 + 7 + 1 + 1 + 2 + 1


def test_registry_launcher_and_data_do_not_import_torch():
    """`lossguard` lists and launches the zoo without the training stack; only the job itself needs torch."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    src = str(Path(__file__).resolve().parents[2] / "src")
    code = ("import sys, lossguard.probe.scenarios, lossguard.probe.launch, lossguard.probe.data; "
            "sys.exit(2 if 'torch' in sys.modules else 0)")
    env = {**os.environ, "PYTHONPATH": src}
    assert subprocess.run([sys.executable, "-c", code], env=env, check=False).returncode == 0
