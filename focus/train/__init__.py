"""Training: the resumable loop that trains whatever requires grad, and the models and adapters it trains.

    config      TrainConfig and ScratchModel: optimizer, schedule, logging, evaluation and checkpoint settings; the
                shape of a model trained from scratch
    loop        `train_parameters` (exact resume, data parallel), `evaluate_loss`, `next_token_loss`
    checkpoint  the resume state: written atomically, refused when it does not fit the run
    lora        PEFT LoRA adapters, the baseline the paper compares Focus against
    scratch     a small Llama-style decoder built from random initialisation

The names below load on first use (`focus.lazy`): the profile reads `focus.train.config` without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from focus.lazy import lazy_exports

if TYPE_CHECKING:
    from focus.train.config import TrainConfig as TrainConfig
    from focus.train.loop import evaluate_loss as evaluate_loss
    from focus.train.loop import train_parameters as train_parameters

_HOMES = {"TrainConfig": "focus.train.config", "evaluate_loss": "focus.train.loop", "train_parameters": "focus.train.loop"}
__all__ = list(_HOMES)
__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
