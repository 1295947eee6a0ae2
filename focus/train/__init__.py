"""Training: the resumable loop that trains whatever requires grad, and the models and adapters it trains.

    config      TrainConfig: optimizer, schedule, logging, evaluation and checkpoint settings
    loop        `train_parameters` (exact resume, data parallel), `evaluate_loss`, `next_token_loss`
    checkpoint  the resume state: written atomically, refused when it does not fit the run
    lora        PEFT LoRA adapters, the baseline the paper compares Focus against
    scratch     a small Llama-style decoder built from random initialisation
"""

from focus.train.config import TrainConfig
from focus.train.loop import evaluate_loss, train_parameters

__all__ = ["TrainConfig", "evaluate_loss", "train_parameters"]
