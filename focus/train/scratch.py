"""A small Llama-style decoder built from random initialisation, for the from-scratch comparison."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedModel

from focus.config import ConfigError, check_types, from_dict


@dataclass(frozen=True)
class ScratchModel:
    """Shape of the Llama-style decoder trained from scratch. The vocabulary is the tokenizer's; embeddings are tied."""

    layers: int = field(default=4, metadata={"help": "Decoder layers."})
    hidden: int = field(default=128, metadata={"help": "Hidden size (heads x head size)."})
    heads: int = field(default=4, metadata={"help": "Query heads."})
    kv_heads: int = field(default=2, metadata={"help": "Key/value heads (grouped-query attention; = heads for MHA)."})
    ffn: int | None = field(
        default=None, metadata={"help": "MLP inner size; default 8/3 x hidden rounded up to a multiple of 64."}
    )

    def __post_init__(self) -> None:
        check_types(self)
        for name in ("layers", "hidden", "heads", "kv_heads", "ffn"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"ScratchModel.{name} must be >= 1, got {value}")
        if self.hidden % self.heads:
            raise ConfigError(f"ScratchModel.hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        if self.heads % self.kv_heads:
            raise ConfigError(f"ScratchModel.heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "ScratchModel":
        return from_dict(cls, values)

    @property
    def intermediate(self) -> int:
        return self.ffn or -(-8 * self.hidden // (3 * 64)) * 64


def llama_config(shape: ScratchModel, vocab_size: int, max_positions: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,  # as SmolLM2: at 49,152 tokens the embeddings are most of a small model
    )


def build_model(shape: ScratchModel, vocab_size: int, max_positions: int, seed: int) -> PreTrainedModel:
    """A randomly initialised Llama-style causal LM (float32, SDPA attention, eval mode), identical for equal `seed`.

    The global torch RNG is left untouched.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(
            llama_config(shape, vocab_size, max_positions), dtype=torch.float32, attn_implementation="sdpa"
        )
    return model.eval()


def unigram_loss(train_rows: torch.Tensor, eval_rows: torch.Tensor, vocab_size: int) -> float:
    """Mean next-token loss of a model without context: token frequencies of `train_rows` (add-one smoothed), scored
    on the tokens `evaluate_loss` scores (positions 1..L-1 of each of `eval_rows` (M, L)). The level a trained
    model must get well below."""
    counts = torch.bincount(train_rows.reshape(-1), minlength=vocab_size).double() + 1.0
    log_p = counts.log() - counts.sum().log()
    return -log_p[eval_rows[:, 1:].reshape(-1)].mean().item()
