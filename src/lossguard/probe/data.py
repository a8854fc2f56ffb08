"""Deterministic synthetic chat data, a tiny tokenizer and LLaVA/FastChat-style label masking.

The masking is a faithful copy of the logic that really kills runs (known issues template-mismatch, truncation-cuts-answers): the prompt is rendered
with one conversation template, the supervised span is recomputed round by round with the *training* template's
separators, and any disagreement masks the whole sample (`target[:] = -100`) with the same warning LLaVA prints.
So a template mismatch here produces all-`-100` labels for real, not a faked log line. Pure Python: tensors are
made only by the collator.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

IGNORE_INDEX = -100

# Special tokens first so their ids are stable; then the characters the synthetic data uses.
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|end|>", "USER:", "ASSISTANT:")
ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789 :.,?!-"


class CharTokenizer:
    """Char-level tokenizer with whole-word special tokens; greedy longest match, so it is deterministic."""

    def __init__(self) -> None:
        self.vocab = list(SPECIAL_TOKENS) + list(ALPHABET)
        self.token_to_id = {t: i for i, t in enumerate(self.vocab)}
        self.pad_id = self.token_to_id["<pad>"]
        self.bos_id = self.token_to_id["<s>"]
        self.eos_id = self.token_to_id["</s>"]
        # Longest first so "<|assistant|>" wins over any prefix.
        self._specials = sorted(SPECIAL_TOKENS, key=len, reverse=True)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        ids = [self.bos_id] if add_bos else []
        i = 0
        while i < len(text):
            special = next((s for s in self._specials if text.startswith(s, i)), None)
            if special is not None:
                ids.append(self.token_to_id[special])
                i += len(special)
            else:
                ids.append(self.token_to_id[text[i]])
                i += 1
        return ids

    def decode(self, ids: list[int]) -> str:
        return "".join(self.vocab[i] for i in ids if i >= 0)


@dataclass(frozen=True)
class Template:
    """A conversation style as LLaVA's `conv_templates` hold it: role strings and the two separators."""

    name: str
    user: str
    assistant: str
    sep: str  # after the user turn
    sep2: str  # after the assistant turn: ends a round

    def render(self, turns: list[tuple[str, str]]) -> str:
        return "".join(f"{self.user}{q}{self.sep}{self.assistant}{a}{self.sep2}" for q, a in turns)


TEMPLATES = {
    "chatml": Template("chatml", "<|user|>", "<|assistant|>", "<|end|>", "</s>"),
    "vicuna_v1": Template("vicuna_v1", "USER: ", "ASSISTANT: ", " ", "</s>"),
}


def make_conversations(num_samples: int, seed: int = 0, num_turns: int = 1) -> list[list[tuple[str, str]]]:
    """Learnable toy tasks (copy / reverse a word) so a healthy run's loss really falls."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    conversations = []
    for _ in range(num_samples):
        turns = []
        for _ in range(num_turns):
            word = "".join(rng.choice(letters) for _ in range(rng.randint(3, 6)))
            if rng.random() < 0.5:
                turns.append((f"copy {word}", word))
            else:
                turns.append((f"reverse {word}", word[::-1]))
        conversations.append(turns)
    return conversations


def preprocess(
    turns: list[tuple[str, str]],
    tokenizer: CharTokenizer,
    *,
    template: str = "chatml",
    mask_template: str | None = None,
    max_length: int = 64,
    log=print,
) -> dict[str, list[int]]:
    """Tokenize one conversation and mask everything but the assistant answers.

    `template` renders the text (what the data / chat template produced); `mask_template` is the style the
    training script believes in (LLaVA's `--version`). They differ in a mismatch scenario. The round-by-round
    length bookkeeping and the all-or-nothing fallback follow `llava/train/train.py:preprocess_v1`.
    """
    render = TEMPLATES[template]
    conv = TEMPLATES[mask_template or template]
    prompt = render.render(turns)
    input_ids = tokenizer.encode(prompt)[:max_length]  # truncation can cut every answer (D2)
    target = list(input_ids)
    total_len = len(tokenizer.encode(prompt))  # LLaVA compares against the untruncated count

    cur_len = 1  # BOS
    target[:cur_len] = [IGNORE_INDEX] * cur_len
    rounds = [r for r in prompt.split(conv.sep2) if r]
    for rou in rounds:
        rou = rou + conv.sep2
        parts = rou.split(conv.assistant)
        if len(parts) != 2:
            break  # the training template's roles are not in the text: nothing is recognised
        instruction = parts[0] + conv.assistant
        round_len = len(tokenizer.encode(rou, add_bos=False))
        instruction_len = len(tokenizer.encode(instruction, add_bos=False))
        end = min(cur_len + instruction_len, len(target))
        target[cur_len:end] = [IGNORE_INDEX] * (end - cur_len)
        cur_len += round_len
    target[cur_len:] = [IGNORE_INDEX] * max(0, len(target) - cur_len)

    if cur_len < max_length and cur_len != total_len:
        target = [IGNORE_INDEX] * len(target)
        log(f"WARNING: tokenization mismatch: {cur_len} vs. {total_len}. (ignored)")
    return {"input_ids": input_ids, "labels": target}


def build_dataset(
    num_samples: int,
    *,
    seed: int = 0,
    template: str = "chatml",
    mask_template: str | None = None,
    max_length: int = 64,
    num_turns: int = 1,
    log=print,
) -> list[dict[str, list[int]]]:
    tokenizer = CharTokenizer()
    return [
        preprocess(turns, tokenizer, template=template, mask_template=mask_template, max_length=max_length, log=log)
        for turns in make_conversations(num_samples, seed=seed, num_turns=num_turns)
    ]


def count_supervised(sample: dict[str, list[int]]) -> int:
    """Label tokens that reach the loss after the causal shift (labels[1:])."""
    return sum(1 for t in sample["labels"][1:] if t != IGNORE_INDEX)


def collate(batch: list[dict[str, list[int]]], pad_id: int = 0) -> dict:
    """Right-pad to the longest sample; padded labels are -100 and attention 0."""
    import torch  # deferred: data.py itself stays importable without torch

    width = max(len(s["input_ids"]) for s in batch)
    ids, labels, attn = [], [], []
    for s in batch:
        pad = width - len(s["input_ids"])
        ids.append(s["input_ids"] + [pad_id] * pad)
        labels.append(s["labels"] + [IGNORE_INDEX] * pad)
        attn.append([1] * len(s["input_ids"]) + [0] * pad)
    out = {"input_ids": torch.tensor(ids), "labels": torch.tensor(labels), "attention_mask": torch.tensor(attn)}
    if "image_features" in batch[0]:
        out["image_features"] = torch.stack([s["image_features"] for s in batch])
    return out
