"""A small Llama-style decoder built from random initialisation, for the from-scratch comparison."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedModel

from focus.train.config import ScratchModel


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
