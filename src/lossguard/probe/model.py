"""Tiny models for the fault zoo: a 2-layer GPT-2 causal LM and a LLaVA-shaped vision-language wrapper.

Both are built from a config in code (no hub access) with a fixed seed, so two runs of a scenario start from
the same weights and a healthy twin differs from its faulty run only by the fault.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

from lossguard.probe.data import IGNORE_INDEX

VOCAB_SIZE = 64  # >= CharTokenizer().vocab_size (51), rounded up like real vocabularies are


def tiny_gpt2(
    *, seed: int = 0, vocab_size: int = VOCAB_SIZE, n_embd: int = 32, n_layer: int = 2, n_positions: int = 64
) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=vocab_size,
        n_positions=n_positions,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=2,
        # No dropout: faulty and healthy twins must see the same numbers up to the fault.
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    config._attn_implementation = "eager"  # the causal-mask scenario patches the eager path
    return GPT2LMHeadModel(config)


class TinyVLM(nn.Module):
    """Frozen "vision tower" on random image features -> projector -> the LM, image tokens prepended.

    The `tune_mm_mlp_adapter` / `freeze_mm_mlp_adapter` / `freeze_backbone` flags act exactly as in LLaVA's
    `train.py`: the flags are applied in order, so a wrong combination silently freezes the module that was
    meant to train (known issue trainable-not-optimized) and nothing complains.
    """

    def __init__(
        self,
        *,
        seed: int = 0,
        image_dim: int = 16,
        num_image_tokens: int = 4,
        tune_mm_mlp_adapter: bool = False,
        freeze_mm_mlp_adapter: bool = False,
        freeze_backbone: bool = False,
    ) -> None:
        super().__init__()
        self.lm = tiny_gpt2(seed=seed)
        torch.manual_seed(seed + 1)
        hidden = self.lm.config.n_embd
        self.num_image_tokens = num_image_tokens
        self.vision_tower = nn.Linear(image_dim, hidden)
        self.mm_projector = nn.Sequential(nn.Linear(hidden, hidden), nn.GELU(), nn.Linear(hidden, hidden))
        self.config = self.lm.config  # the Trainer reads model.config (e.g. hidden_size for ZeRO "auto")

        self.vision_tower.requires_grad_(False)  # always frozen, as in LLaVA
        if freeze_backbone:
            self.lm.requires_grad_(False)
        if tune_mm_mlp_adapter:
            # LLaVA: train only the projector.
            self.requires_grad_(False)
            self.mm_projector.requires_grad_(True)
        if freeze_mm_mlp_adapter:
            self.mm_projector.requires_grad_(False)

    def forward(self, input_ids, labels=None, attention_mask=None, image_features=None, **kwargs):
        # kwargs carry the Trainer's `num_items_in_batch`: swallowing it would make the Trainer scale a mean loss
        # by the world size (it assumes a model that takes loss kwargs divides by the global token count).
        text = self.lm.get_input_embeddings()(input_ids)
        if image_features is None:
            return self.lm(inputs_embeds=text, labels=labels, attention_mask=attention_mask, **kwargs)
        image = self.mm_projector(self.vision_tower(image_features.to(text.dtype)))
        embeds = torch.cat([image, text], dim=1)
        batch = input_ids.shape[0]
        if labels is not None:
            pad = labels.new_full((batch, self.num_image_tokens), IGNORE_INDEX)
            labels = torch.cat([pad, labels], dim=1)
        if attention_mask is not None:
            attention_mask = torch.cat([attention_mask.new_ones(batch, self.num_image_tokens), attention_mask], 1)
        return self.lm(inputs_embeds=embeds, labels=labels, attention_mask=attention_mask, **kwargs)


def pretrain_lm(lm: nn.Module, batches, steps: int, lr: float = 1e-2, seed: int = 0) -> None:
    """Train the LM alone on text for `steps` batches, the pretrained LLM a LLaVA stage 1 starts from; the
    module's `requires_grad` flags are restored afterwards. Deterministic: every rank gets the same weights."""
    flags = [p.requires_grad for p in lm.parameters()]
    lm.requires_grad_(True)
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(lm.parameters(), lr=lr)
    for _, batch in zip(range(steps), batches):
        out = lm(input_ids=batch["input_ids"], labels=batch["labels"], attention_mask=batch["attention_mask"])
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
    for param, flag in zip(lm.parameters(), flags):
        param.requires_grad_(flag)

