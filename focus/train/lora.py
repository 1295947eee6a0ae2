"""LoRA baselines (PEFT): the fine-tuning method the paper compares Focus against on alignment.

A LoRA variant is named by its rank and learning rate ("lora_r8_lr1e-4"), so every (rank, lr) cell of a
profile's grid is a pipeline method like "focus-hard". Training goes through the same loop, rows, steps and
batch as the centroids (`focus.train.train_parameters` trains whatever requires grad); the saved adapter is
PEFT's own format (`adapter_config.json` + `adapter_model.safetensors`), loadable with `PeftModel.from_pretrained`.
"""

from __future__ import annotations

from pathlib import Path

from torch import nn


def apply_lora(model: nn.Module, rank: int, alpha: float, target_modules: list[str], dropout: float = 0.0, seed: int = 0):
    """Wrap `model` with fresh LoRA adapters (B = 0, so the output is unchanged at step 0); only they train."""
    import torch
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(target_modules), lora_dropout=dropout, bias="none",
                        task_type="CAUSAL_LM")
    torch.manual_seed(seed)  # the A matrices are random: the same seed gives the same adapter init
    return get_peft_model(model, config)


def load_lora(model: nn.Module, adapter_dir: str | Path) -> nn.Module:
    """`model` with the LoRA adapter in `adapter_dir` merged into its weights (plain model, full speed)."""
    from peft import PeftModel

    return PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
