"""TrainConfig: how the trainable parameters are optimized, logged, evaluated and checkpointed; ScratchModel: the shape
of the model the from-scratch comparison trains. Free of torch: the profile validates both when Snakemake starts."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from focus.config import ConfigError, check_types, from_dict, to_dict


@dataclass(frozen=True)
class TrainConfig:
    """How the trainable parameters are optimized, logged, evaluated and checkpointed."""

    steps: int = field(default=1000, metadata={
        "help": "Total optimizer steps of the run (0: none, the parameters stay as they came and are scored once on "
                "the eval data: Focus's k-means centroids, untrained)."})
    batch_size: int = field(default=8, metadata={"help": "Sequences per optimizer step."})
    lr: float = field(
        default=1e-3, metadata={"help": "Peak AdamW learning rate (centroids tolerate a high one)."}
    )
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW decoupled weight decay."})
    warmup_steps: int = field(
        default=0, metadata={"help": "Linear warmup from lr/warmup_steps to lr over this many steps."}
    )
    schedule: Literal["constant", "cosine"] = field(
        default="cosine", metadata={"help": "LR after warmup: constant, or cosine decay to lr * min_lr_ratio."}
    )
    min_lr_ratio: float = field(
        default=0.1, metadata={"help": "Cosine schedule: final LR as a fraction of lr."}
    )
    grad_clip: float = field(
        default=1.0, metadata={"help": "Clip the global gradient norm to this value (0 disables)."}
    )
    seed: int = field(
        default=0, metadata={"help": "Seeds the batch order and the global RNGs at the start of a run."}
    )
    log_every: int = field(
        default=10, metadata={"help": "Append a train line to metrics.jsonl every this many steps (and at the end)."}
    )
    checkpoint_every: int = field(
        default=100, metadata={"help": "Write checkpoint.pt every this many steps (0 = only at the end)."}
    )
    eval_every: int = field(
        default=0,
        metadata={"help": "Evaluate eval_data every this many steps (0 = only at the end; never without eval_data)."},
    )
    eval_batch_size: int = field(default=8, metadata={"help": "Sequences per forward pass during evaluation."})

    def __post_init__(self) -> None:
        check_types(self)
        for name in ("batch_size", "log_every", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"TrainConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("steps", "warmup_steps", "checkpoint_every", "eval_every", "seed"):
            if getattr(self, name) < 0:
                raise ConfigError(f"TrainConfig.{name} must be >= 0, got {getattr(self, name)}")
        # `not x >= 0` also rejects NaN, which every plain comparison lets through.
        for name in ("weight_decay", "grad_clip"):
            if not getattr(self, name) >= 0:
                raise ConfigError(f"TrainConfig.{name} must be >= 0, got {getattr(self, name)}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ConfigError(f"TrainConfig.lr must be a finite number > 0, got {self.lr}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError(f"TrainConfig.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.warmup_steps > self.steps:
            raise ConfigError(
                f"TrainConfig.warmup_steps ({self.warmup_steps}) must be <= steps ({self.steps})"
            )

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "TrainConfig":
        return from_dict(cls, values)

    def replace(self, **changes: Any) -> "TrainConfig":
        """A copy with `changes`, checked as a new config is."""
        return from_dict(TrainConfig, {**to_dict(self), **changes})

    def lr_factor(self, step: int) -> float:
        """LR multiplier for the optimizer step that follows `step` completed steps (0-based)."""
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - self.warmup_steps) / max(1, self.steps - self.warmup_steps))
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


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
